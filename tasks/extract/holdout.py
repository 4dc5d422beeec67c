"""A val split held out of train for a source that ships none (params.yaml `extract.holdout`).

An image is held out when `holdout_value(name, seed)` — the first 8 bytes of BLAKE2b-64 of its name, keyed with
`imagenet-parquet/holdout/v1/<seed>`, as an integer — is below `fraction` x 2^64. The decision looks at that image
alone: adding, removing or relabelling other images, selecting classes, or another worker count never moves an
image between train and val (a fixed count per class could not promise that: a new image that ranks first would
push an old one out). Each class keeps about `fraction` of its images as val; `extract_report.json` `holdout` counts
them, and names the classes left without a val (or a train) image."""

from __future__ import annotations

import hashlib
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tasks.common.params import HoldoutParams

HOLDOUT_KEY = b"imagenet-parquet/holdout/v1/"
BATCH = 1 << 16  # names hashed per step
HOLDOUT_WHERE = "held out of train (params.yaml extract.holdout)"  # the val split's `where` in messages


def holdout_value(name: str, seed: int) -> int:
    """The image's place in [0, 2^64): held out when below fraction x 2^64."""
    key = HOLDOUT_KEY + str(seed).encode()
    digest = hashlib.blake2b(name.encode("utf-8", "surrogateescape"), digest_size=8, key=key).digest()
    return int.from_bytes(digest, "big")


def is_held_out(names: list[str], holdout: HoldoutParams) -> list[bool]:
    threshold = int(holdout.fraction * (1 << 64))
    return [holdout_value(name, holdout.seed) < threshold for name in names]


def split_holdout(train: pa.Table, holdout: HoldoutParams) -> tuple[pa.Table, pa.Table, dict[str, Any]]:
    """(train, val, the report's `holdout` section) of a source scanned as one train split."""
    names = train.column("name")
    held = pa.chunked_array(  # BATCH names at a time as Python strings, never the whole column
        [
            pa.array(is_held_out(names.slice(i, BATCH).to_pylist(), holdout), pa.bool_())
            for i in range(0, len(names), BATCH)
        ],
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


def _missing(split: str, classes: set[str], limit: int = 20) -> dict[str, Any]:
    return {f"classes_without_{split}": len(classes), f"classes_without_{split}_first": sorted(classes)[:limit]}
