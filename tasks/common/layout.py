"""What the stages hand each other: split and archive names, shipped facts, the manifest schema, file names.

The formats are described in docs/CONTRACTS.md; the Parquet shard format itself is `imagenet_parquet.format`."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

DATA_DIR = Path(__file__).with_name("data")  # facts the product ships (synsets, MD5 tables, subsets)
SPLITS = ("train", "val")  # every split the pipeline writes, in this order
ARCHIVES = {
    "train": "ILSVRC2012_img_train.tar",
    "val": "ILSVRC2012_img_val.tar",
    "devkit": "ILSVRC2012_devkit_t12.tar.gz",
}
# extract -> convert, validate: one row per image, where its bytes lie (docs/CONTRACTS.md "Manifests")
MANIFEST_SCHEMA = pa.schema(
    [
        ("split", pa.string()),
        ("label", pa.int64()),
        ("wnid", pa.string()),
        ("name", pa.string()),
        ("source", pa.string()),
        ("member", pa.string()),
        ("offset", pa.int64()),
        ("size", pa.int64()),
    ]
)
EXTRACT_REPORT = "extract_report.json"  # under paths.manifests
BAD_IMAGES = "bad_images.jsonl"  # convert -> validate: quarantined images, under paths.parquet
REPORT_MD = "schema_report.md"  # validate -> deploy: the reviewer's report, under paths.reports


def manifest_path(manifests_dir: Path, split: str) -> Path:
    """The manifest of `split` (written by extract)."""
    return manifests_dir / f"{split}.parquet"
