"""Overlays for tests: the curation overlay of shards as they are, written directly in the overlay format."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from imagenet_parquet.overlay import footer_digest, footer_tail, overlay_table, write_overlay
from tasks.common import SPLITS
from tasks.common.layout import CURATION_REPORT


def write_test_overlay(parquet_dir: Path, overlay_dir: Path | None = None,
                       labels: dict[tuple[str, str], int] | None = None,
                       exclude: set[tuple[str, str]] = frozenset(), curation: dict[str, Any] | None = None) -> Path:
    """An overlay per split for the shards under `parquet_dir` as they are now (the convert labels, every row kept,
    unless `labels` / `exclude` name (split, image name)), and curation.json (`curation`, default: no lines) —
    written directly in the overlay format, for tests that need the merged view without the curate stage."""
    overlay_dir = overlay_dir or Path(parquet_dir).parent / "overlay"
    overlay_dir.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        shards, found, names = [], [], []
        for path in sorted((Path(parquet_dir) / split).glob("*.parquet")):
            table = pq.ParquetFile(path).read(columns=["image.path", "label"])
            shards.append((path.name, len(table), footer_digest(footer_tail(path))))
            found += table.column("label").to_pylist()
            names += table.column("image").combine_chunks().field("path").to_pylist()
        now = np.array([(labels or {}).get((split, n), found[i]) for i, n in enumerate(names)], dtype=np.int64)
        keep = np.array([(split, n) not in exclude for n in names], dtype=bool)
        edits = {"relabelled": int((now != np.array(found, dtype=np.int64)).sum()), "excluded": int((~keep).sum())}
        write_overlay(overlay_table(split, shards, now, keep, edits), overlay_dir / f"{split}.parquet")
    report = curation or {"files": {"exclude": None, "relabel": None}, "applied": [], "not_in_shards": []}
    (overlay_dir / CURATION_REPORT).write_text(json.dumps(report), encoding="utf-8")
    return overlay_dir
