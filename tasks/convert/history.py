"""The layout history (issue 33): `<paths.versions>/layout.json`, which generation of shards each split holds, so a
`dvc repro` after images were added writes only the new images, in new shards, and never rewrites a shard.

Generation 0 is the canonical layout a convert without history writes (tasks/convert/plan.py); every later convert
whose manifests hold images that no listed shard holds writes those alone (hashed order among themselves, the same
writer) as generation g + 1, named `<split>-g<g+1>-<stem>.parquet`, each with the label map current at its
conversion and `generation` in its metadata (docs/CONTRACTS.md). An image's identity is (class id, name); a
modified image (same identity, a pass-through row whose stored size differs from the source's) is new again. What
the source no longer holds, and what a newer generation replaced, the curate stage excludes in the overlay.

The file is small (per shard: name, rows, sizes, md5; per bad image its record), tracked in git
(`cache: false, persist: true`), and the only state convert reads besides its inputs: the shards it lists must be
present with their listed sizes, in the Parquet directory or in the DVC cache (DVC deletes the directory before the
stage runs; tasks/convert/relink.py links them back), else the run stops. A history written for other output params or
library versions (`identity`) is dropped with a line saying so: that convert rewrites every shard anyway.
`python -m tasks.convert.history discard` (`make relayout`) removes it: the next convert is canonical."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imagenet_parquet.format import decode_image_index
from tasks.common import PipelineError, dumps_json, write_json
from tasks.common.generations import coded_ids, identity_keys, newest_rows, shard_classes
from tasks.common.layout import LAYOUT_HISTORY
from tasks.common.params import path_key

HISTORY_FORMAT = 1
SHARD_FIELDS = ("name", "rows", "file_bytes", "image_bytes", "input_bytes", "md5")
DISCARD = "run `make relayout` (or `python -m tasks.convert.history discard`) to drop it and convert the current "
DISCARD += "source from scratch (the canonical layout), or restore the file from git"


@dataclass(frozen=True)
class SplitHistory:
    """One split's generations as stored: [{generation, shards: [{SHARD_FIELDS}], bad: [{record, class}]}]."""

    generations: list[dict[str, Any]]

    @property
    def shards(self) -> list[dict[str, Any]]:
        return [s for g in self.generations for s in g["shards"]]

    @property
    def next_generation(self) -> int:
        return max(int(g["generation"]) for g in self.generations) + 1

    def digest(self) -> str:
        return hashlib.sha256(dumps_json(self.generations).encode()).hexdigest()

    def present(self, directory: Path) -> bool:
        """Every listed shard is in `directory` with its listed size."""
        return all(_found_size(directory, s) == s["file_bytes"] for s in self.shards)

    def bad_keys(self) -> list[tuple[str, str]]:
        return [(str(b["class"]), str(b["record"]["name"])) for g in self.generations for b in g["bad"]]


def read_history(path: Path, identity: str, quiet: bool = False) -> dict[str, SplitHistory] | None:
    """The history at `path` for output identity `identity`; None when there is none or it is another identity's
    (said in a line unless `quiet`)."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        splits = {split: SplitHistory(_checked(split, gens)) for split, gens in doc["splits"].items()}
        if doc["format"] != HISTORY_FORMAT or not isinstance(doc["identity"], str):
            raise ValueError(f"format {doc['format']!r}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise PipelineError(
            f"{path}: expected the layout history convert writes (format {HISTORY_FORMAT}: identity, splits -> "
            f"generations of shards), found {type(err).__name__}: {err}; {DISCARD}"
        ) from None
    if doc["identity"] != identity:
        if quiet:
            return None
        print(
            f"convert: {path} was written for other output params or library versions: every shard is "
            "rewritten, in the canonical layout, and the history starts again"
        )
        return None
    return splits


def _checked(split: str, generations: Any) -> list[dict[str, Any]]:
    if not isinstance(generations, list) or not generations:
        raise ValueError(f"split {split!r}: no generations")
    for number, gen in enumerate(generations):
        if gen.get("generation") != number or not isinstance(gen.get("bad"), list):
            raise ValueError(f"split {split!r}: generation {number} out of order or malformed")
        for shard in gen["shards"]:
            if sorted(shard) != sorted(SHARD_FIELDS) or "/" in shard["name"] or not shard["name"].endswith(".parquet"):
                raise ValueError(f"split {split!r}: a shard entry {shard!r}")
    return list(generations)


def write_history(path: Path, identity: str, splits: dict[str, list[dict[str, Any]]]) -> None:
    write_json(path, {"format": HISTORY_FORMAT, "identity": identity, "splits": splits}, path_key("versions"))


@dataclass(frozen=True)
class KnownRows:
    """The rows the history's shards hold, one per identity: key, stored image size, and whether it was stored as
    found (transform `none`: its size is the source's)."""

    keys: pa.Array
    sizes: np.ndarray
    plain: np.ndarray


def known_rows(directory: Path, history: SplitHistory) -> KnownRows:
    """The newest row of every identity the listed shards in `directory` hold (`newest_rows`, as curate judges
    them), from the footer and three small columns (no image byte)."""
    keys, sizes, plain, generations = [], [], [], []
    seen: dict[Any, Any] = {}
    for gen in history.generations:
        for shard in gen["shards"]:
            path = _listed(directory, shard, int(gen["generation"]))
            try:
                key, size, flat = _shard_rows(path, seen)
            except (OSError, ValueError, pa.ArrowException) as err:
                raise PipelineError(
                    f"{path}: expected the shard {LAYOUT_HISTORY} lists (md5 {shard['md5']}), found an unreadable "
                    f"file ({' '.join(str(err).split())}); run `dvc checkout` to restore it, or "
                    f"{DISCARD.removeprefix('run ')}"
                ) from None
            keys.append(key)
            sizes.append(size)
            plain.append(flat)
            generations.append(np.full(len(key), int(gen["generation"]), dtype=np.int64))
    if not keys:
        return KnownRows(pa.array([], pa.string()), np.zeros(0, np.int64), np.zeros(0, bool))
    known = KnownRows(pa.concat_arrays(keys), np.concatenate(sizes), np.concatenate(plain))
    newest = newest_rows(known.keys, np.concatenate(generations))
    if newest is None:
        return known
    return KnownRows(known.keys.filter(pa.array(newest)), known.sizes[newest], known.plain[newest])


def _shard_rows(path: Path, seen: dict[Any, Any]) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    file = pq.ParquetFile(path)
    meta = file.schema_arrow.metadata
    own = shard_classes(meta, path, seen)
    table = file.read(columns=["image.path", "label", "transform"], use_threads=False)
    names = table.column("image").combine_chunks().field("path")
    key = identity_keys(coded_ids(table.column("label").to_numpy(), own.ids), names)
    index = decode_image_index(meta, table.num_rows, path)
    size = index[:, 1] if index is not None else np.full(table.num_rows, -1, dtype=np.int64)
    flat = pc.equal(table.column("transform"), "none").to_numpy(zero_copy_only=False)
    return key, size, flat


def _listed(directory: Path, shard: dict[str, Any], generation: int) -> Path:
    path = directory / str(shard["name"])
    found = _found_size(directory, shard)
    if found != shard["file_bytes"]:
        raise PipelineError(
            f"{path}: expected the shard of generation {generation} that {LAYOUT_HISTORY} lists "
            f"({shard['file_bytes']:,} bytes, md5 {shard['md5']}), found "
            f"{'no file' if found is None else f'{found:,} bytes'} (nor in the DVC cache); run `dvc pull` (or "
            f"`dvc fetch`) for the version this history belongs to, or {DISCARD.removeprefix('run ')}"
        )
    return path


def _found_size(directory: Path, shard: dict[str, Any]) -> int | None:
    path = directory / str(shard["name"])
    return path.stat().st_size if path.is_file() else None


def usable(history: SplitHistory | None, directory: Path, split: str) -> SplitHistory | None:
    """`history` to append to, or None for a canonical convert: a history of generation 0 alone whose shards are
    not all here holds only what a convert of the source writes again (a fresh clone, `make clean`, a crash)."""
    if history is None or len(history.generations) > 1 or history.present(directory):
        return history
    print(
        f"convert: {split}: shards of the layout history are missing; it holds the canonical layout only, "
        "which a convert of the source writes again"
    )
    return None


def new_rows(manifest: pa.Table, known: KnownRows, bad: list[tuple[str, str]]) -> np.ndarray:
    """True for every manifest row (wnid, name, size) no listed shard holds as it is now: an identity never
    converted (nor quarantined), or a pass-through row whose stored size differs from the source's (modified)."""
    keys = identity_keys(manifest.column("wnid").combine_chunks(), manifest.column("name").combine_chunks())
    where = pc.index_in(keys, value_set=known.keys).to_numpy(zero_copy_only=False)
    found = ~np.isnan(where)
    rows = where[found].astype(np.int64)
    sizes = manifest.column("size").to_numpy()[found]
    modified = known.plain[rows] & (known.sizes[rows] >= 0) & (known.sizes[rows] != sizes)
    new = ~found
    new[np.flatnonzero(found)[modified]] = True
    if bad:
        quarantined = pa.array([f"{c}\0{n}" for c, n in bad], pa.string())
        new &= ~pc.is_in(keys, value_set=quarantined).to_numpy(zero_copy_only=False)
    result: np.ndarray = new
    return result


def merged(
    history: SplitHistory | None, plans: list[Any], results: list[dict[str, Any]], split: str
) -> list[dict[str, Any]]:
    """`split`'s generations after this run: the history's, plus the shards written now (`plans` with their
    `results`, in plan order) as the next generation — or as generation 0 when there was no history."""
    mine = [(p, r) for p, r in zip(plans, results, strict=True) if p.split == split]
    if not mine and history is not None:
        return list(history.generations)  # nothing new
    canonical = history is None or any(p.generation == 0 for p, _ in mine)  # a convert without (usable) history
    generations = [] if canonical or history is None else list(history.generations)
    shards = [{key: _entry(p, r)[key] for key in SHARD_FIELDS} for p, r in mine]
    bad = [
        {"record": record, "class": cls}
        for _, r in mine
        for record, cls in zip(r["bad"], r.get("bad_classes") or [""] * len(r["bad"]), strict=True)
    ]
    return [*generations, {"generation": len(generations), "shards": shards, "bad": bad}]


def _entry(plan: Any, result: dict[str, Any]) -> dict[str, Any]:
    sizes = {key: result[key] for key in ("file_bytes", "image_bytes", "input_bytes")}
    return {"name": plan.name, "rows": result["count"], "md5": result["md5"], **sizes}


def main(argv: list[str]) -> int:
    """`discard`: remove the layout history named by params.yaml (`paths.versions`): the next convert is canonical."""
    from tasks.common.params import load_project

    if argv != ["discard"]:
        print("usage: python -m tasks.convert.history discard", file=sys.stderr)
        return 2
    project = load_project("params.yaml")
    path = project.root / project.paths["versions"] / LAYOUT_HISTORY
    path.unlink(missing_ok=True)
    print(f"{path}: removed; the next `dvc repro` converts the current source in the canonical layout")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
