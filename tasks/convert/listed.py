"""The shards the layout history lists, held to it before convert counts a row of them (issue 49): a history edited
by hand (`rows` 15 -> 14), merged or checked out beside other shards must never put a wrong count into the metrics,
the history or dvc.lock.

Each listed shard must be in the Parquet directory with its listed size (`present`), its footer must hold the listed
rows, image bytes (the footer byte index), generation and split (`check_footer`: the footer convert reads anyway, no
image byte), and its bytes must be the listed md5 (`check_md5s`), which is known without reading them wherever the
file came from a source that names it: linked back from the DVC cache file named by that md5 or from a resume link
whose stats carry it (tasks/convert/relink.py), the stats convert wrote for this very file (size, mtime, inode), or
DVC's state for the file as it is now. Only a file none of them vouches for is hashed (a copy made outside DVC). A
mismatch is one PipelineError line naming the history file, the generation and the field, expected and found."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from tasks.common import PipelineError
from tasks.common.dvc_state import stat_key, state_md5s
from tasks.common.generations import ShardClasses
from tasks.convert.history_schema import DISCARD, where
from tasks.convert.job import Job

RESTORE = "`dvc checkout` (or `dvc pull`) the shards of the version this history belongs to"


def present(directory: Path, shard: dict[str, Any]) -> int | None:
    """The size of the listed `shard`'s file in `directory`, None when there is none."""
    path = directory / str(shard["name"])
    return path.stat().st_size if path.is_file() else None


def listed_path(layout: Path, directory: Path, shard: dict[str, Any], generation: int) -> Path:
    """The listed `shard`'s file in `directory`, with its listed size, or PipelineError (`dvc pull` it)."""
    path = directory / str(shard["name"])
    found = present(directory, shard)
    if found != shard["file_bytes"]:
        raise PipelineError(
            f"{path}: expected the shard of generation {generation} that {layout} lists ({shard['file_bytes']:,} "
            f"bytes, md5 {shard['md5']}), found {'no file' if found is None else f'{found:,} bytes'} (nor in the "
            f"DVC cache); run `dvc pull` (or `dvc fetch`) for the version this history belongs to, or "
            f"{_discard(layout).removeprefix('run ')}"
        )
    return path


def check_footer(layout: Path, generations: list[dict[str, Any]], loc: list[Any], footer: dict[str, Any]) -> None:
    """`footer` (what a shard's footer holds, `footer_facts`) agrees with the listed shard at `loc` (splits, split,
    generation, shards, index) of `generations`: its rows, image bytes, generation and split, and its input bytes
    as far as the rows tell them (`_input_bytes`)."""
    shard = generations[loc[2]]["shards"][loc[4]]
    wanted = {"rows": shard["rows"], "image_bytes": shard["image_bytes"], "generation": loc[2], "split": loc[1]}
    doc, what = {"splits": {loc[1]: generations}}, f"what the footer of {footer['path']} holds"
    for field, value in wanted.items():
        if footer[field] != value:
            _mismatch(layout, doc, [*loc, field], footer[field], value, what)
    expected = _input_bytes(footer, shard["input_bytes"], exact=footer["all_plain"] and not generations[loc[2]]["bad"])
    if expected is not None:
        _mismatch(layout, doc, [*loc, "input_bytes"], expected, shard["input_bytes"], what)


def _input_bytes(footer: dict[str, Any], listed: int, exact: bool) -> Any:
    """None when `listed` can be the shard's input bytes, else what it must be. A row stored as found (transform
    `none`) was read as the bytes it holds: a shard of such rows alone, in a generation that quarantined nothing,
    was converted from exactly its image bytes; any other from at least the bytes of those rows."""
    if exact:
        return None if listed == footer["plain_bytes"] else footer["plain_bytes"]
    return None if listed >= footer["plain_bytes"] else f">= {footer['plain_bytes']}"


def footer_facts(
    path: Path, own: ShardClasses, rows: int, index: np.ndarray | None, plain: np.ndarray
) -> dict[str, Any]:
    """What a shard's footer says of it, as the history lists it (`check_footer`); `plain`: per row, stored as
    found (transform `none`)."""
    sizes = index[:, 1] if index is not None else None  # no byte index: never convert's shard
    return {
        "path": path,
        "rows": rows,
        "image_bytes": int(sizes.sum()) if sizes is not None else None,
        "plain_bytes": int(sizes[plain].sum()) if sizes is not None else 0,
        "all_plain": bool(plain.all()),
        "generation": own.generation,
        "split": own.split,
    }


def check_md5s(job: Job, split: str, generations: list[dict[str, Any]], vouched: set[Path]) -> None:
    """Every listed shard of `split` (in the Parquet directory, with its listed size) holds the listed md5;
    `vouched`: the files relink.restore_listed put back from a source named by it."""
    todo, doc = [], {"splits": {split: generations}}
    for number, gen in enumerate(generations):
        for index, shard in enumerate(gen["shards"]):
            path = job.parquet / split / str(shard["name"])
            loc = ["splits", split, number, "shards", index, "md5"]
            if path in vouched:
                continue
            known = _own_stats_md5(job.stats_file(split, str(shard["name"])), path)
            if known is None:
                todo.append((loc, shard, path))
            elif known != shard["md5"]:
                _mismatch(job.layout, doc, loc, known, shard["md5"], "the MD5 convert recorded when it wrote this file")
    recorded = state_md5s(path for _, _, path in todo)
    for loc, shard, path in todo:
        found = recorded.get(str(path)) or _md5(path)
        if found != shard["md5"]:
            how = "DVC's record of this file" if str(path) in recorded else "the file's MD5"
            _mismatch(job.layout, doc, loc, found, shard["md5"], how)


def _own_stats_md5(stats_file: Path, path: Path) -> str | None:
    """The md5 convert's stats record for the file at `path` when they were written for it as it is now."""
    try:
        stats = json.loads(stats_file.read_text(encoding="utf-8"))
        same = isinstance(stats, dict) and stats.get("stat") == stat_key(path) and isinstance(stats.get("md5"), str)
    except (OSError, ValueError):
        return None
    return str(stats["md5"]) if same else None


def _md5(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "md5").hexdigest()


def _mismatch(layout: Path, doc: dict[str, Any], loc: list[Any], truth: Any, listed: Any, what: str) -> None:
    raise PipelineError(
        f"{layout}: {where(loc, doc)}: expected {truth!r} ({what}), found {listed!r}; if the history is right, "
        f"{RESTORE}; else {_discard(layout).removeprefix('run ')}"
    )


def _discard(layout: Path) -> str:
    return DISCARD.replace("<file>", str(layout))
