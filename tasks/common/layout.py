"""What the stages hand each other: split and archive names, shipped facts, file names (no heavy imports: every
stage loads this).

The formats are described in docs/CONTRACTS.md; the manifests' schema is `tasks.common.manifests`, the Parquet
shard format `imagenet_parquet.format`."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).with_name("data")  # facts the product ships (synsets, MD5 tables, subsets)
SPLITS = ("train", "val")  # every split the pipeline writes, in this order
ARCHIVES = {
    "train": "ILSVRC2012_img_train.tar",
    "val": "ILSVRC2012_img_val.tar",
    "devkit": "ILSVRC2012_devkit_t12.tar.gz",
}
EXTRACT_REPORT = "extract_report.json"  # under paths.manifests
PRESCAN = "prescan"  # under paths.work: the archives' tar index made while hashing them (tasks.common.archive_pass)
BAD_IMAGES = "bad_images.jsonl"  # convert -> validate: quarantined images, under paths.parquet
REPORT_MD = "schema_report.md"  # validate -> deploy: the reviewer's report, under paths.reports
CURATION_REPORT = "curation.json"  # curate -> validate: the curation lines applied, under paths.overlay
LAYOUT_HISTORY = "layout.json"  # convert: the generations of shards per split, under paths.versions (git-tracked)
