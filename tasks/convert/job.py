"""The convert stage's job description: the output-relevant `convert:` params + the paths it reads and writes.

A `Job` is small and picklable: it is what travels to worker processes / Dask workers with a shard's row range."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.common import SPLITS
from tasks.common.layout import LAYOUT_HISTORY
from tasks.common.manifests import manifest_path
from tasks.common.params import ConvertParams
from tasks.convert.imaging import Policy
from tasks.convert.plan import ShardPlan


@dataclass(frozen=True)
class Job:
    manifests: Path
    label_map: Path
    parquet: Path
    work: Path
    metrics: Path
    layout: Path  # <paths.versions>/layout.json: the generations of shards (tasks/convert/history.py)
    policy: Policy = field(default_factory=Policy)
    shard_mb: float = 256
    row_group_rows: int = 100
    order: str = "hashed"  # tasks/convert/plan.py ORDERS
    fingerprint: bool = True  # compute `phash` (tasks/convert/fingerprint.py); False: the column is null
    max_bad_fraction: float = 0.001
    root: Path = Path(".")  # manifest `source` paths are relative to it (the repo) unless absolute

    @property
    def target_bytes(self) -> int:
        return int(self.shard_mb * (1 << 20))

    def manifest(self, split: str) -> Path:
        return manifest_path(self.manifests, split)

    def splits(self) -> list[str]:
        return [split for split in SPLITS if self.manifest(split).is_file()]

    def shard_path(self, plan: ShardPlan) -> Path:
        return self.parquet / plan.split / plan.name

    def scratch(self, split: str) -> Path:
        """The split's scratch directory: per shard its stats, its manifest rows and its resume link."""
        return self.work / "convert" / split

    def stats_file(self, split: str, shard: str) -> Path:
        return self.scratch(split) / shard.replace(".parquet", ".json")

    def resume_file(self, split: str, shard: str) -> Path:
        """The finished shard's resume link beside its stats (tasks/convert/relink.py)."""
        return self.scratch(split) / shard

    def stats_path(self, plan: ShardPlan) -> Path:
        return self.stats_file(plan.split, plan.name)

    def resume_path(self, plan: ShardPlan) -> Path:
        return self.resume_file(plan.split, plan.name)

    def rows_path(self, plan: ShardPlan) -> Path:
        return self.scratch(plan.split) / plan.name.replace(".parquet", ".rows.parquet")

    def output_params(self) -> dict[str, Any]:
        """Every param that changes the bytes written (stored in each shard's metadata and in every shard's resume
        key); never the worker count. `max_side` only when set: absent means no bound, so the shards of a convert
        without it keep their keys and bytes."""
        p = self.policy
        bounded = {"max_side": p.max_side} if p.max_side is not None else {}
        return {
            "policy": p.policy,
            "quality": p.quality,
            "resize_shorter": p.resize_shorter,
            **bounded,
            "exif": p.exif,
            "max_image_pixels": p.max_image_pixels,
            "full_decode": p.full_decode,
            "shard_mb": self.shard_mb,
            "row_group_rows": self.row_group_rows,
            "order": self.order,
            "fingerprint": self.fingerprint,
        }


def job_from_params(params: ConvertParams, paths: Mapping[str, Path], root: str | os.PathLike[str] = ".") -> Job:
    """The Job for params.yaml's `convert:` section and `paths:` (relative ones resolve against `root`, the repo)."""
    root = Path(root)
    policy = Policy(
        policy=params.policy,
        quality=params.quality,
        resize_shorter=params.resize_shorter,
        max_side=params.max_side,
        exif=params.exif,
        max_image_pixels=params.max_image_pixels,
        full_decode=params.full_decode,
    )
    return Job(
        manifests=root / paths["manifests"],
        label_map=root / paths["label_map"],
        parquet=root / paths["parquet"],
        work=root / paths["work"],
        metrics=root / paths["metrics"] / "convert.json",
        layout=root / paths["versions"] / LAYOUT_HISTORY,
        policy=policy,
        shard_mb=params.shard_mb,
        row_group_rows=params.row_group_rows,
        order=params.order,
        fingerprint=params.fingerprint,
        max_bad_fraction=params.max_bad_fraction,
        root=root,
    )
