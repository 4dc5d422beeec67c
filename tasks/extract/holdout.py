"""A val split held out of train for a source that ships none (params.yaml `extract.holdout`).

An image is held out when `holdout_value(name, seed, wnid)` — the first 8 bytes of a keyed BLAKE2b-64 as an integer
— is below `fraction` x 2^64. Folder mode hashes `<class>/<name>` keyed with `imagenet-parquet/holdout/v2/<seed>`
(one file name may be in every class folder — `0001.jpg` — and must not be held out of every class at once; a
class name holds no `/`, so the text is unambiguous); archive21k hashes the name alone keyed with
`imagenet-parquet/holdout/v1/<seed>` (its names, `<wnid>_<n>.JPEG`, already carry the class). The decision looks at
that image alone: adding, removing or relabelling other images, selecting classes, or another worker count never
moves an image between train and val (a fixed count per class could not promise that: a new image that ranks first
would push an old one out). Each class keeps about `fraction` of its images as val; `extract_report.json`
`holdout` counts them, and names the classes left without a val (or a train) image."""

from __future__ import annotations

import hashlib
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tasks.common.params import HoldoutParams

HOLDOUT_KEY = b"imagenet-parquet/holdout/v1/"  # the name alone (archive21k)
CLASS_HOLDOUT_KEY = b"imagenet-parquet/holdout/v2/"  # `<class>/<name>` (folder mode)
BATCH = 1 << 16  # names hashed per step
HOLDOUT_WHERE = "held out of train (params.yaml extract.holdout)"  # the val split's `where` in messages


def holdout_value(name: str, seed: int, wnid: str | None = None) -> int:
    """The image's place in [0, 2^64): held out when below fraction x 2^64. `wnid` (the class as found: folder
    mode) hashes `<wnid>/<name>` with the v2 key; None the name alone with the v1 key."""
    text, key = (name, HOLDOUT_KEY) if wnid is None else (f"{wnid}/{name}", CLASS_HOLDOUT_KEY)
    digest = hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=8, key=key + str(seed).encode())
    return int.from_bytes(digest.digest(), "big")


def is_held_out(names: list[str], holdout: HoldoutParams, wnids: list[str] | None = None) -> list[bool]:
    threshold = int(holdout.fraction * (1 << 64))
    classes = wnids if wnids is not None else [None] * len(names)
    return [holdout_value(n, holdout.seed, w) < threshold for n, w in zip(names, classes, strict=True)]


def split_holdout(
    train: pa.Table, holdout: HoldoutParams, by_class: bool = False
) -> tuple[pa.Table, pa.Table, dict[str, Any]]:
    """(train, val, the report's `holdout` section) of a source scanned as one train split; `by_class` (folder
    mode): each image hashed with its class (see the module docstring)."""
    names, wnids = train.column("name"), train.column("wnid")
    held = pa.chunked_array(  # BATCH names at a time as Python strings, never the whole column
        [pa.array(_held_batch(names, wnids, i, holdout, by_class), pa.bool_()) for i in range(0, len(names), BATCH)],
        pa.bool_(),
    )
    kept, val = train.filter(pc.invert(held)), train.filter(held)
    classes = {
        split: set(table.column("wnid").unique().to_pylist()) for split, table in (("train", kept), ("val", val))
    }
    every = classes["train"] | classes["val"]
    report = {
        "fraction": holdout.fraction,
        "seed": holdout.seed,
        "images": {"train": kept.num_rows, "val": val.num_rows},
        **_missing("val", every - classes["val"]),
        **_missing("train", every - classes["train"]),
    }
    return kept, val, report


def _held_batch(
    names: pa.ChunkedArray, wnids: pa.ChunkedArray, start: int, holdout: HoldoutParams, by_class: bool
) -> list[bool]:
    classes = wnids.slice(start, BATCH).to_pylist() if by_class else None
    return is_held_out(names.slice(start, BATCH).to_pylist(), holdout, classes)


def _missing(split: str, classes: set[str], limit: int = 20) -> dict[str, Any]:
    return {f"classes_without_{split}": len(classes), f"classes_without_{split}_first": sorted(classes)[:limit]}
