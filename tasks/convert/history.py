"""The layout history (issue 33): `<paths.versions>/layout.json`, which generation of shards each split holds, so a
`dvc repro` after images were added writes only the new images, in new shards, and never rewrites a shard.

Generation 0 is the canonical layout a convert without history writes (tasks/convert/plan.py); every later convert
whose manifests hold images that no listed shard holds writes those alone (hashed order among themselves, the same
writer) as generation g + 1, named `<split>-g<g+1>-<stem>.parquet`, each with the label map current at its
conversion and `generation` in its metadata (docs/CONTRACTS.md). An image's identity is (class id, name); a
modified image (same identity, a pass-through row whose stored size differs from the source's) is new again. What
the source no longer holds, and what a newer generation replaced, the curate stage excludes in the overlay.

The file is small (per shard: name, rows, sizes, md5; per bad image its record), tracked in git
(`cache: false, persist: true`), and the only state convert reads besides its inputs — so it is an input like any
other: checked whole against its schema before convert works (tasks/convert/history_schema.py), and every shard it
lists held to it (tasks/convert/listed.py: its size, its footer's rows, image bytes, generation and split, its md5)
before a row of it is counted. The shards must be present, in the Parquet directory or in the DVC cache (DVC deletes
the directory before the stage runs; tasks/convert/relink.py links them back), else the run stops. A history written
for other output params or library versions (`identity`) is dropped with a line saying so: that convert rewrites
every shard anyway.
`python -m tasks.convert.history discard` (`make relayout`) removes it: the next convert is canonical."""

from __future__ import annotations

import hashlib
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
from tasks.convert.history_schema import DISCARD, HISTORY_FORMAT, ShardEntry, parse_history
from tasks.convert.listed import check_footer, footer_facts, listed_path, present

SHARD_FIELDS = tuple(ShardEntry.model_fields)  # name, rows, file_bytes, image_bytes, input_bytes, md5


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
        return all(present(directory, s) == s["file_bytes"] for s in self.shards)

    def bad_keys(self) -> list[tuple[str, str]]:
        return [(str(b["class"]), str(b["record"]["name"])) for g in self.generations for b in g["bad"]]


def read_history(path: Path, identity: str, quiet: bool = False) -> dict[str, SplitHistory] | None:
    """The history at `path` for output identity `identity`, checked whole (tasks/convert/history_schema.py: one
    PipelineError line for any problem); None when there is none or it is another identity's (said in a line
    unless `quiet`)."""
    if not path.exists() and not path.is_symlink():
        return None
    doc = parse_history(path)
    if doc["identity"] != identity:
        if quiet:
            return None
        print(
            f"convert: {path} was written for other output params or library versions: every shard is "
            "rewritten, in the canonical layout, and the history starts again"
        )
        return None
    return {split: SplitHistory(list(gens)) for split, gens in doc["splits"].items()}


def write_history(path: Path, identity: str, splits: dict[str, list[dict[str, Any]]]) -> None:
    write_json(path, {"format": HISTORY_FORMAT, "identity": identity, "splits": splits}, path_key("versions"))


@dataclass(frozen=True)
class KnownRows:
    """The rows the history's shards hold, one per identity: key, stored image size, and whether it was stored as
    found (transform `none`: its size is the source's)."""

    keys: pa.Array
    sizes: np.ndarray
    plain: np.ndarray


def known_rows(parquet: Path, split: str, history: SplitHistory, layout: Path) -> KnownRows:
    """The newest row of every identity the listed shards of `split` in `parquet` hold (`newest_rows`, as curate judges
    them), from the footer and three small columns (no image byte); each shard's footer checked against the
    history (`layout`) as it is read (tasks/convert/listed.py)."""
    keys, sizes, plain, generations = [], [], [], []
    seen: dict[Any, Any] = {}
    directory = parquet / split
    for number, gen in enumerate(history.generations):
        for index, shard in enumerate(gen["shards"]):
            path = listed_path(layout, directory, shard, number)
            try:
                key, size, flat, footer = _shard_rows(path, seen)
            except (OSError, ValueError, pa.ArrowException) as err:
                raise PipelineError(
                    f"{path}: expected the shard {layout} lists (md5 {shard['md5']}), found an unreadable file "
                    f"({' '.join(str(err).split())}); run `dvc checkout` to restore it, or "
                    f"{DISCARD.replace('<file>', str(layout)).removeprefix('run ')}"
                ) from None
            check_footer(layout, history.generations, ["splits", split, number, "shards", index], footer)
            keys.append(key)
            sizes.append(size)
            plain.append(flat)
            generations.append(np.full(len(key), number, dtype=np.int64))
    if not keys:
        return KnownRows(pa.array([], pa.string()), np.zeros(0, np.int64), np.zeros(0, bool))
    known = KnownRows(pa.concat_arrays(keys), np.concatenate(sizes), np.concatenate(plain))
    newest = newest_rows(known.keys, np.concatenate(generations))
    if newest is None:
        return known
    return KnownRows(known.keys.filter(pa.array(newest)), known.sizes[newest], known.plain[newest])


def _shard_rows(path: Path, seen: dict[Any, Any]) -> tuple[pa.Array, np.ndarray, np.ndarray, dict[str, Any]]:
    file = pq.ParquetFile(path)
    meta = file.schema_arrow.metadata
    own = shard_classes(meta, path, seen)
    table = file.read(columns=["image.path", "label", "transform"], use_threads=False)
    names = table.column("image").combine_chunks().field("path")
    key = identity_keys(coded_ids(table.column("label").to_numpy(), own.ids), names)
    index = decode_image_index(meta, table.num_rows, path)
    size = index[:, 1] if index is not None else np.full(table.num_rows, -1, dtype=np.int64)
    flat = pc.equal(table.column("transform"), "none").to_numpy(zero_copy_only=False)
    return key, size, flat, footer_facts(path, own, file.metadata.num_rows, index, flat)


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
