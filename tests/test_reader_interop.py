"""The shards are plain Parquet: DuckDB SQL, pandas and polars (metadata columns only), Hugging Face `datasets`
(Image + ClassLabel names from the schema metadata) read them without this project's code."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.datasets import write_shards
from tests.helpers.images import identify

TOTAL, CLASSES = 30, 3
META = ["label", "wnid", "label_name", "width", "height"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("parquet")
    write_shards(root, total=TOTAL, classes=CLASSES, shards=2, row_group_rows=4)
    return root / "train"


def _expected_counts() -> dict[str, int]:
    return dict(Counter(f"class {i * CLASSES // TOTAL}" for i in range(TOTAL)))


def test_duckdb_sql_count_per_label_name(shards):
    import duckdb

    rows = duckdb.sql(
        f"SELECT label_name, count(*) AS n FROM read_parquet('{shards}/*.parquet') GROUP BY label_name ORDER BY 1"
    ).fetchall()
    assert dict(rows) == _expected_counts()
    sizes = duckdb.sql(f"SELECT sum(octet_length(image.bytes)) FROM read_parquet('{shards}/*.parquet')").fetchall()[0]
    assert sizes[0] > 0


def test_pandas_and_polars_read_metadata_columns_only(shards):
    import pandas as pd
    import polars as pl

    frame = pd.read_parquet(shards, columns=META)
    assert list(frame.columns) == META and len(frame) == TOTAL
    assert frame.groupby("label_name").size().to_dict() == _expected_counts()
    lazy = pl.scan_parquet(f"{shards}/*.parquet").select(META)
    counts = lazy.group_by("label_name").len().collect()
    assert dict(zip(counts["label_name"], counts["len"])) == _expected_counts()
    assert lazy.collect().columns == META


def test_huggingface_datasets_image_and_classlabel(shards, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    files = sorted(str(p) for p in shards.glob("*.parquet"))
    ds = datasets.load_dataset("parquet", data_files={"train": files}, split="train",
                               cache_dir=str(tmp_path / "hf-cache"))
    assert isinstance(ds.features["image"], datasets.Image)
    assert isinstance(ds.features["label"], datasets.ClassLabel)
    assert ds.features["label"].names == [f"class {k}" for k in range(CLASSES)]
    assert len(ds) == TOTAL
    row = ds[TOTAL - 1]
    assert identify(row["image"].convert("RGB")) == TOTAL - 1
    assert ds.features["label"].int2str(row["label"]) == row["label_name"] == f"class {CLASSES - 1}"


def test_huggingface_grayscale_recipe_returns_rgb(tmp_path, monkeypatch):
    """Grayscale JPEGs are stored as found (mode L); the README's recipe, `cast_column("image", Image(mode="RGB"))`,
    makes `datasets` return RGB for every row (the project's reader always does)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from imagenet_parquet import ParquetImageDataset
    from imagenet_parquet.format import shard_schema
    from tests.helpers.datasets import contract_row, numbered_label_map

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    buf = io.BytesIO()
    Image.linear_gradient("L").resize((32, 24)).save(buf, "JPEG", quality=90)
    lmap = numbered_label_map(1)
    rows = [contract_row(buf.getvalue(), "gray.JPEG", 0, "n10000000", "class 0")]
    (tmp_path / "train").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=shard_schema(lmap, {}, "train")), tmp_path / "train" / "a.parquet")
    ds = datasets.load_dataset("parquet", data_files=[str(tmp_path / "train" / "a.parquet")], split="train",
                               cache_dir=str(tmp_path / "hf"))
    assert ds[0]["image"].mode == "L"  # as stored
    rgb = ds.cast_column("image", datasets.Image(mode="RGB"))
    assert rgb[0]["image"].mode == "RGB" and rgb[0]["image"].size == (32, 24)
    assert ParquetImageDataset(tmp_path, "train")[0][0].mode == "RGB"
