"""The pipeline's shard writer: imagenet_parquet.writer (one writer for every shard the project writes: the convert
stage, compaction and the reader's materialise command — the same settings, the same bytes), its errors as
PipelineErrors, each shard published atomically."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from imagenet_parquet import writer
from imagenet_parquet.writer import WriteError
from tasks.common import PipelineError, atomic_path


class ShardWriter(writer.ShardWriter):
    """imagenet_parquet.writer.ShardWriter whose errors are PipelineErrors (a setting's as its params.yaml key)."""

    def write(self, rows: Iterator[dict[str, Any]]) -> int:
        try:
            return super().write(rows)
        except WriteError as err:
            where = f"params.yaml convert.{err.param}: " if err.param else ""
            raise PipelineError(f"{where}{err}") from None


def write_shard(path: Path, schema: pa.Schema, row_group_rows: int, rows: Iterator[dict[str, Any]]) -> tuple[int, str]:
    """Write `rows` to `path` atomically (temp name in the same directory, renamed when complete); returns the row
    count and the file's MD5 (computed from the bytes as they were written: no read back of the image data)."""
    with atomic_path(path) as tmp:
        shard = ShardWriter(tmp, schema, row_group_rows)
        count = shard.write(rows)
    return count, shard.md5
