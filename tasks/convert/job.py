"""The convert stage's job description: validated `convert:` params + the paths it reads and writes.

A `Job` is small and picklable: it is what travels to worker processes / Dask workers with a shard's row range."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.common import PipelineError
from tasks.common import SPLITS
from tasks.convert.imaging import Policy

POLICIES = ("passthrough", "reencode")
EXIF_POLICIES = ("keep", "transpose")
RUNNERS = ("local", "dask")


@dataclass(frozen=True)
class Job:
    manifests: Path
    label_map: Path
    parquet: Path
    work: Path
    metrics: Path
    policy: Policy = field(default_factory=Policy)
    shard_mb: float = 256
    row_group_rows: int = 100
    max_bad_fraction: float = 0.001
    root: Path = Path(".")  # manifest `source` paths are relative to it (the repo) unless absolute

    @property
    def target_bytes(self) -> int:
        return int(self.shard_mb * (1 << 20))

    def manifest(self, split: str) -> Path:
        return self.manifests / f"{split}.parquet"

    def splits(self) -> list[str]:
        return [split for split in SPLITS if self.manifest(split).is_file()]

    def shard_path(self, plan: Any) -> Path:
        return self.parquet / plan.split / plan.name

    def stats_path(self, plan: Any) -> Path:
        return self.work / "convert" / plan.split / plan.name.replace(".parquet", ".json")

    def rows_path(self, plan: Any) -> Path:
        return self.work / "convert" / plan.split / plan.name.replace(".parquet", ".rows.parquet")

    def output_params(self) -> dict[str, Any]:
        """Every param that changes the bytes written (stored in each shard's metadata); never the worker count."""
        p = self.policy
        return {"policy": p.policy, "quality": p.quality, "resize_shorter": p.resize_shorter, "exif": p.exif,
                "max_image_pixels": p.max_image_pixels, "full_decode": p.full_decode,
                "shard_mb": self.shard_mb, "row_group_rows": self.row_group_rows}


def job_from_params(cfg: dict[str, Any], paths: dict[str, Path], root: str | os.PathLike = ".") -> Job:
    """Build a Job from params.yaml's `convert:` section and `paths:` (relative to `root`, the repo)."""
    root = Path(root)
    policy = Policy(
        policy=_choice(cfg, "policy", POLICIES),
        quality=_int(cfg, "quality", 1, 100),
        resize_shorter=None if cfg.get("resize_shorter") is None else _int(cfg, "resize_shorter", 1, 1 << 16),
        exif=_choice(cfg, "exif", EXIF_POLICIES),
        max_image_pixels=_int(cfg, "max_image_pixels", 1, 1 << 40),
        full_decode=bool(cfg.get("full_decode", False)),
    )
    return Job(
        manifests=root / paths["manifests"], label_map=root / paths["label_map"], parquet=root / paths["parquet"],
        work=root / paths["work"], metrics=root / paths["metrics"] / "convert.json", policy=policy,
        shard_mb=_number(cfg, "shard_mb", 0.001, 1 << 20),
        row_group_rows=_int(cfg, "row_group_rows", 1, 1 << 24),
        max_bad_fraction=_number(cfg, "max_bad_fraction", 0, 1), root=root,
    )


def runner_params(cfg: dict[str, Any]) -> tuple[str, int, str | None]:
    """(task_runner, workers, dask_address), validated."""
    runner = _choice(cfg, "task_runner", RUNNERS)
    address = cfg.get("dask_address")
    if runner == "dask" and not address:
        raise PipelineError("params.yaml convert.dask_address: expected a scheduler address (tcp://host:8786) "
                            "with task_runner: dask, found none; set it or use task_runner: local")
    return runner, _int(cfg, "workers", 1, 4096), address


def _choice(cfg: dict[str, Any], key: str, allowed: tuple[str, ...]) -> str:
    value = cfg.get(key)
    if value not in allowed:
        raise PipelineError(f"params.yaml convert.{key}: expected one of {list(allowed)}, found {value!r}")
    return value


def _int(cfg: dict[str, Any], key: str, low: int, high: int) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PipelineError(f"params.yaml convert.{key}: expected an integer in [{low}, {high}], found {value!r}")
    return value


def _number(cfg: dict[str, Any], key: str, low: float, high: float) -> float:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise PipelineError(f"params.yaml convert.{key}: expected a number in [{low}, {high}], found {value!r}")
    return value
