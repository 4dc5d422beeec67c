"""Issue 36 items 3 and 7: the curated views for other tools (DuckDB `curated_sql`, `read_curated` for pandas,
polars and Hugging Face) curate every label-derived column and refuse an overlay that is not the shards' as the
readers do; byte flips in an overlay's shard-name dictionary are one OverlayError, never a raw UnicodeDecodeError."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from imagenet_parquet import ParquetImageDataset
from imagenet_parquet.overlay import OverlayError
from imagenet_parquet.tables import curated_sql, read_curated
from tests.helpers.datasets import numbered_label_map, write_shards
from tests.helpers.images import identify
from tests.test_overlay_reader import CLASSES, TOTAL, require_overlay, write_curation

duckdb = pytest.importorskip("duckdb")


@pytest.fixture
def curated(tmp_path) -> tuple[Path, dict[int, int]]:
    files = write_shards(tmp_path / "parquet", "train", classes=CLASSES, total=TOTAL, shards=3, row_group_rows=4)
    require_overlay(files)
    return tmp_path / "parquet", write_curation(tmp_path, files)


def _expected(want: dict[int, int]) -> list[tuple[int, str, str]]:
    classes = numbered_label_map(CLASSES)["classes"]
    return [(want[k], classes[want[k]]["wnid"], classes[want[k]]["name"]) for k in sorted(want)]


def test_every_label_derived_column_is_curated_in_sql_and_tables(curated):
    root, want = curated
    expected = _expected(want)
    converted = pq.read_table(root / "train", columns=["label"]).column(0).to_numpy()
    assert sum(want[k] != converted[k] for k in want) > 0  # some rows are relabelled
    sql = duckdb.sql(curated_sql(root, "train")).select("label, wnid, label_name").fetchall()
    assert sql == expected  # not the converted wnid and label_name beside the curated label
    table = read_curated(root, "train", columns=["label", "wnid", "label_name"])
    assert list(zip(*(table.column(c).to_pylist() for c in ("label", "wnid", "label_name")), strict=True)) == expected
    frame = read_curated(root, "train").to_pandas()
    assert list(frame[["label", "wnid", "label_name"]].itertuples(index=False, name=None)) == expected
    images = duckdb.sql(curated_sql(root, "train")).select("image").fetchall()
    assert [identify(Image.open(io.BytesIO(row[0]["bytes"]))) for row in images] == sorted(
        want
    )  # the kept images, in shard order


def test_a_previous_versions_overlay_beside_new_shards_is_refused_by_every_view(curated):
    """A node that pulled data/parquet but not yet data/overlay: the old overlay beside the new shards."""
    root, _ = curated
    require_overlay(sorted((root / "train").glob("*.parquet")), row_group_rows=3)  # new shards, same rows
    for view in (lambda: curated_sql(root, "train"), lambda: read_curated(root, "train", columns=["label"])):
        with pytest.raises(OverlayError, match="footer sha256"):
            view()


def test_a_missing_shard_is_refused_and_a_shard_changed_after_the_check_fails_the_query(curated, tmp_path):
    root, _ = curated
    files = sorted((root / "train").glob("*.parquet"))
    query = curated_sql(root, "train")
    shutil.copyfile(files[0], tmp_path / "spare.parquet")
    os.replace(tmp_path / "spare.parquet", files[1])  # another valid shard under the name, after the check
    with pytest.raises(duckdb.Error, match="expected the shards it was checked against"):
        duckdb.sql(query).fetchall()
    files[1].unlink()
    for view in (lambda: curated_sql(root, "train"), lambda: read_curated(root, "train")):
        with pytest.raises(OverlayError, match=f"expected shard {files[1].name} .*found no such file"):
            view()


def test_byte_flips_in_the_overlay_shard_names_are_overlay_errors_or_the_right_labels(curated):
    """Every byte of the `shard` column chunk (its dictionary of shard names) flipped three ways, one at a time:
    each either is refused with an OverlayError naming the overlay, or changes nothing read."""
    root, want = curated
    path = root.parent / "overlay" / "train.parquet"
    original = path.read_bytes()
    chunk = pq.read_metadata(path).row_group(0).column(0)
    assert chunk.path_in_schema == "shard"
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    refused, held = 0, 0
    for offset in range(start, start + chunk.total_compressed_size):
        for mask in (0x80, 0x01, 0x20):
            data = bytearray(original)
            data[offset] ^= mask
            path.write_bytes(bytes(data))
            try:
                ds = ParquetImageDataset(root, "train", transform=identify)
            except OverlayError as err:
                assert str(err).startswith(f"{path}: expected") and "\n" not in str(err)
                refused += 1
                continue
            assert [(int(i), int(y)) for i, y in (ds[k] for k in range(len(ds)))] == sorted(want.items())
            held += 1
    assert refused > 0 and refused + held == 3 * chunk.total_compressed_size
    path.write_bytes(original)
    assert np.array_equal(ParquetImageDataset(root, "train").targets, [want[k] for k in sorted(want)])
