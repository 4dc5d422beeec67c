"""Cost of the footer byte index in the shard writer (issue 6): the convert stage's `write_shard` (locates every
image value and writes `imagenet_parquet.image_offsets`) vs the same rows through the previous writer (a plain
ParquetWriter on the path, same settings, no index), side by side in one run; then, when the reader benchmark's
shards exist, the CPU cost of fetching one image's bytes in random order (no decode): a file of the folder tree,
`ParquetImageDataset(decode=False)[i]` through the index, and the same with the index hidden (row-group path).

    python -m benchmarks.bench_shard_index [--images 2000] [--rounds 5]

Images: the real JPEGs of the reader benchmark's folder tree (benchmarks/_work/reader/5000-images/folder, made by
bench_reader.py) else ../shared/data/imagenet-samples. Rows are built before timing; only writing is timed.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import REPO, SAMPLES, WORK
from imagenet_parquet import ParquetImageDataset
from imagenet_parquet.format import IMAGE_INDEX_KEY, shard_schema
from imagenet_parquet.writer import memory_pool, to_table, writer_options
from tasks.common.params import load_project
from tasks.common.shard_writer import write_shard
from tasks.convert.fingerprint import stored_fingerprint


def rows_of(files: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for i, path in enumerate(files):
        data = path.read_bytes()
        rows.append(
            {
                "image": {"bytes": data, "path": path.name},
                "label": i % 3,
                "wnid": f"n{i % 3:08d}",
                "label_name": f"class {i % 3}",
                "width": 500,
                "height": 375,
                "source_format": "JPEG",
                "transform": "none",
                "exif_orientation": 1,
                "sha256": hashlib.sha256(data).hexdigest(),
                "phash": stored_fingerprint(data),  # the shards' fingerprint column (format 3 on)
            }
        )
    return rows


def previous_writer(path: Path, schema: pa.Schema, row_group_rows: int, rows: list[dict[str, Any]]) -> None:
    """The writer before the index: row groups of `row_group_rows` straight to the path."""
    with pq.ParquetWriter(path, schema, memory_pool=memory_pool(), **writer_options()) as writer:
        for start in range(0, len(rows), row_group_rows):
            part = rows[start : start + row_group_rows]
            writer.write_table(to_table(part, schema), row_group_size=len(part))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the best counts")
    parser.add_argument("--work", type=Path, default=WORK / "shard_index")
    args = parser.parse_args()
    folder = WORK / "reader" / "5000-images" / "folder"
    source = folder if folder.is_dir() else SAMPLES
    rows = rows_of(sorted(source.rglob("*.JPEG"))[: args.images])
    rg = load_project(REPO / "params.yaml").params.convert.row_group_rows
    label_map = {
        "num_classes": 3,
        "label_source": "bench",
        "classes": [{"label": i, "wnid": f"n{i:08d}", "name": f"class {i}"} for i in range(3)],
    }
    schema = shard_schema(label_map, {"policy": "passthrough"}, "train")
    args.work.mkdir(parents=True, exist_ok=True)
    writers: dict[str, Callable[[Path], object]] = {
        "previous writer (no index)": lambda p: previous_writer(p, schema, rg, rows),
        "write_shard (+ byte index)": lambda p: write_shard(p, schema, rg, iter(rows)),
    }
    best = {name: float("inf") for name in writers}
    for _ in range(args.rounds):
        for i, (name, write) in enumerate(writers.items()):
            (args.work / f"{i}.parquet").unlink(missing_ok=True)  # not timed: freeing the previous round's file
            start = time.perf_counter()
            write(args.work / f"{i}.parquet")
            best[name] = min(best[name], time.perf_counter() - start)
    mb = sum(len(r["image"]["bytes"]) for r in rows) / 1e6
    base = best["previous writer (no index)"]
    print(f"{len(rows)} images, {mb:.0f} MB, {rg}-row groups, best of {args.rounds}")
    print("| writer | seconds | MB/s | x previous | file bytes | footer index bytes |\n|---|---:|---:|---:|---:|---:|")
    for i, name in enumerate(writers):
        path = args.work / f"{i}.parquet"
        index = len((pq.read_metadata(path).metadata or {}).get(IMAGE_INDEX_KEY.encode(), b""))
        print(
            f"| {name} | {best[name]:.3f} | {mb / best[name]:.0f} | {best[name] / base:.2f} | "
            f"{path.stat().st_size} | {index} |"
        )
    read_costs(folder.parent)


def read_costs(work: Path, count: int = 3000) -> None:
    """CPU µs per image fetched in random order (warm page cache), bytes only."""
    folder, shards = work / "folder", work / "shards" / "passthrough"
    if not shards.is_dir():
        return
    files = sorted(folder.rglob("*.JPEG"))
    indexed = ParquetImageDataset(shards, "train", decode=False, overlay=False)
    fallback = ParquetImageDataset(shards, "train", decode=False, overlay=False)
    picks = random.Random(0).sample(range(min(len(files), len(indexed))), min(count, len(indexed)))
    runs: dict[str, Callable[[int], object]] = {
        "folder file (open + read)": lambda i: files[i].read_bytes(),
        "reader, byte index (pread)": indexed.__getitem__,
        "reader, row-group path": fallback.__getitem__,
    }
    print(f"\n{len(picks)} random images, warm cache\n| read | CPU µs/image |\n|---|---:|")
    # hide the fallback's index (no public switch): the row-group path (+ LRU of 4 row groups)
    with mock.patch.object(fallback._indexed, "_load", return_value=None):
        for name, fetch in runs.items():
            for i in picks[:200]:  # warm the page cache and open the files
                fetch(i)
            start = time.process_time()
            for i in picks:
                fetch(i)
            print(f"| {name} | {(time.process_time() - start) / len(picks) * 1e6:.0f} |")


if __name__ == "__main__":
    main()
