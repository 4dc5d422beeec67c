"""Test helper: tiny Parquet shards in the contract schema (docs/CONTRACTS.md), with self-identifying images.

Image i (global row index in shard order) is a solid colour encoding i, so a decoded sample says which row it
came from (`identify`). Schema and metadata come from `imagenet_parquet.format.shard_schema` (the convert stage's own)."""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from imagenet_parquet.format import shard_schema, UNCOMPRESSED_COLUMNS


def label_map(classes: int) -> dict:
    return {"num_classes": classes, "label_source": "devkit",
            "classes": [{"label": k, "wnid": f"n{10000000 + k:08d}", "name": f"class {k}",
                         "words": f"class {k}, thing {k}", "ilsvrc2012_id": k + 1} for k in range(classes)]}


def image_bytes(index: int, noise_px: int = 0, seed: int = 0) -> bytes:
    """An 8x8 solid JPEG whose colour encodes `index` (< 4096); `noise_px` > 0: a large incompressible one."""
    colour = ((index % 64) * 4, (index // 64) * 4, 128)
    if noise_px:
        rng = np.random.default_rng([seed, index])
        pixels = rng.integers(0, 256, (noise_px, noise_px, 3), dtype=np.uint8)
        pixels[:8, :8] = colour
        img = Image.fromarray(pixels)
    else:
        img = Image.new("RGB", (8, 8), colour)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=95)
    return buf.getvalue()


def identify(image: Image.Image) -> int:
    """The row index an `image_bytes` image encodes."""
    red, green, _ = image.getpixel((3, 3))
    return round(red / 4) + 64 * round(green / 4)


def _table(rows: range, labels: list[int], lmap: dict, schema: pa.Schema, noise_px: int) -> pa.Table:
    classes = lmap["classes"]
    data = [image_bytes(i, noise_px) for i in rows]
    size = noise_px or 8
    return pa.table({
        "image": [{"bytes": b, "path": f"{classes[labels[i]]['wnid']}_{i:05d}.JPEG"} for b, i in zip(data, rows)],
        "label": [labels[i] for i in rows],
        "wnid": [classes[labels[i]]["wnid"] for i in rows],
        "label_name": [classes[labels[i]]["name"] for i in rows],
        "width": [size] * len(rows), "height": [size] * len(rows),
        "source_format": ["JPEG"] * len(rows), "transform": ["none"] * len(rows),
        "exif_orientation": [1] * len(rows),
        "sha256": [hashlib.sha256(b).hexdigest() for b in data],
    }, schema=schema)


def write_shards(out_dir: Path, split: str = "train", classes: int = 3, total: int = 47, shards: int = 3,
                 row_group_rows: int = 4, noise_px: int = 0) -> list[Path]:
    """`total` rows sorted by label over `shards` files of `row_group_rows`-row groups; returns the files."""
    lmap = label_map(classes)
    labels = [i * classes // total for i in range(total)]
    schema = shard_schema(lmap, {"policy": "passthrough", "row_group_rows": row_group_rows}, split)
    out = Path(out_dir) / split
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for s in range(shards):
        rows = range(s * total // shards, (s + 1) * total // shards)
        path = out / f"{split}-{s:05d}-of-{shards:05d}.parquet"
        pq.write_table(_table(rows, labels, lmap, schema, noise_px), path, row_group_size=row_group_rows,
                       compression={c: "NONE" if c in UNCOMPRESSED_COLUMNS else "ZSTD"
                                    for c in ["image.bytes", "image.path", *schema.names[1:]]})
        files.append(path)
    (Path(out_dir) / "label_map.json").write_text(json.dumps(lmap, sort_keys=True), encoding="utf-8")
    return files


def run_rank(rank: int, world_size: int, port: int, shard_dir: str, out_path: str) -> None:
    """One distributed rank (spawned process): gloo process group, rank/world_size taken from torch.distributed,
    DataLoader with 2 workers; writes the (row, label) sequence of epochs 0, 1 and 0 again to `out_path`."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from imagenet_parquet import ParquetIterableDataset

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        ds = ParquetIterableDataset(shard_dir, transform=identify, shuffle_buffer=6, seed=7)
        runs: dict = {"rank": ds.rank, "world_size": ds.world_size, "len": len(ds)}
        for name, epoch in [("epoch0", 0), ("epoch1", 1), ("epoch0_again", 0)]:
            ds.set_epoch(epoch)
            # fork, as under torchrun (a spawned rank would otherwise spawn its workers too: slow, not realistic)
            loader = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context="fork")
            runs[name] = [[int(i), int(y)] for ids, labels in loader for i, y in zip(ids, labels)]
        Path(out_path).write_text(json.dumps(runs), encoding="utf-8")
    finally:
        dist.destroy_process_group()
