"""A shard's footer holds the class list a bounded number of times (no `ARROW:schema` repeating the schema
metadata), and a shard written that way reads back exactly as one written with pyarrow's defaults: the Arrow types
of the contract, the label map, Hugging Face's ClassLabel, and the same values in pandas, polars and DuckDB."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from imagenet_parquet.format import FIELDS, label_map_from_metadata, shard_schema
from tasks.common.shard_writer import write_shard
from tests.helpers.datasets import contract_row
from tests.helpers.images import indexed_jpeg

CLASSES, ROWS = 2000, 12
NAME_COPIES = 1  # how many times a footer may hold each class name (the ClassLabel names)
FOOTER_PER_LABEL_MAP = 0.75  # footer bytes at most this many times the label map's JSON (before: 2.6)


def _label_map(classes: int) -> dict:
    """Names unlike any other string of the footer, so each copy of one can be counted."""
    return {"num_classes": classes, "label_source": "catalog",
            "classes": [{"label": k, "wnid": f"n{20000000 + k:08d}", "name": f"zq-name-{k:05d}",
                         "words": f"zq-name-{k:05d}, thing {k}", "ilsvrc2012_id": None} for k in range(classes)]}


def _rows(label_map: dict) -> list[dict]:
    step = label_map["num_classes"] // ROWS
    return [contract_row(indexed_jpeg(i), f"img{i:03d}.JPEG", c["label"], c["wnid"], c["name"])
            for i, c in enumerate(label_map["classes"][::step][:ROWS])]


def _write(path: Path, label_map: dict) -> Path:
    write_shard(path, shard_schema(label_map, {"policy": "passthrough"}, "train"), 5, iter(_rows(label_map)))
    return path


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> tuple[Path, dict]:
    label_map = _label_map(CLASSES)
    return _write(tmp_path_factory.mktemp("footer") / "train-00000-of-00001.parquet", label_map), label_map


def _footer_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    size = int.from_bytes(data[-8:-4], "little")
    return data[-8 - size : -8]


def test_footer_holds_each_class_name_a_bounded_number_of_times(many):
    path, label_map = many
    footer = _footer_bytes(path)
    assert b"ARROW:schema" not in footer
    copies = {footer.count(c["name"].encode() + b'"') for c in label_map["classes"]}  # `"`: not the words' prefix
    assert max(copies) <= NAME_COPIES
    assert len(footer) < FOOTER_PER_LABEL_MAP * len(json.dumps(label_map))


def test_label_map_and_arrow_types_read_back(many):
    path, label_map = many
    shard = pq.ParquetFile(path)
    assert [(f.name, f.type) for f in shard.schema_arrow] == FIELDS
    assert label_map_from_metadata(shard.metadata.metadata, path) == label_map
    assert label_map_from_metadata(shard.schema_arrow.metadata, path) == label_map
    assert pq.read_table(path).to_pylist() == _rows(label_map)


def test_same_inputs_same_bytes(many, tmp_path):
    path, label_map = many
    assert _write(tmp_path / path.name, label_map).read_bytes() == path.read_bytes()


def test_other_readers_see_what_they_see_in_a_default_pyarrow_shard(many, tmp_path, monkeypatch):
    """pandas, polars, DuckDB and Hugging Face `datasets` read the same frame / features from the writer's shard as
    from the same rows written with pyarrow's defaults (which store `ARROW:schema`)."""
    import duckdb
    import pandas as pd
    import polars as pl

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path, label_map = many
    default = tmp_path / "default.parquet"
    pq.write_table(pa.Table.from_pylist(_rows(label_map), schema=shard_schema(label_map, {"policy": "passthrough"},
                                                                                     "train")), default)
    assert b"ARROW:schema" in _footer_bytes(default)
    pd.testing.assert_frame_equal(pd.read_parquet(path), pd.read_parquet(default))
    assert pl.read_parquet(path).equals(pl.read_parquet(default))
    assert pl.read_parquet(path).schema == pl.read_parquet(default).schema
    query = "SELECT * FROM read_parquet('{}') ORDER BY label"
    assert duckdb.sql(query.format(path)).fetchall() == duckdb.sql(query.format(default)).fetchall()
    assert duckdb.sql(query.format(path)).types == duckdb.sql(query.format(default)).types
    assert _hf_features(path, tmp_path / "hf-a") == _hf_features(default, tmp_path / "hf-b")


def _hf_features(path: Path, cache: Path) -> object:
    import datasets

    ds = datasets.load_dataset("parquet", data_files=[str(path)], split="train", cache_dir=str(cache))
    assert isinstance(ds.features["label"], datasets.ClassLabel)
    assert ds.features["label"].num_classes == CLASSES
    return ds.features


def test_label_map_stored_by_field_and_read_back_whole(tmp_path):
    """Format 5 stores the label map without names, one list per field; a shard of format <= 4 (the label map
    whole) and a label map whose classes lack a field (stored whole) read back as they were written."""
    from imagenet_parquet.format import FormatError, own_label_map, stored_label_map

    label_map = _label_map(3)
    stored = stored_label_map(label_map)
    assert "classes" not in stored and stored["class_fields"]["wnid"] == [c["wnid"] for c in label_map["classes"]]
    assert "zq-name-00001" not in json.dumps(stored["class_fields"]["wnid"])
    schema = shard_schema(label_map, {}, "train")
    assert own_label_map(schema.metadata, "x") == label_map
    older = {**json.loads(schema.metadata[b"imagenet_parquet"]), "label_map": label_map}
    assert own_label_map({**schema.metadata, b"imagenet_parquet": json.dumps(older).encode()}, "x") == label_map
    uneven = {**label_map, "classes": [{k: v for k, v in c.items() if k != "words" or c["label"]}
                                       for c in label_map["classes"]]}
    assert stored_label_map(uneven) == uneven
    assert own_label_map(shard_schema(uneven, {}, "train").metadata, "x") == uneven
    cut = {**json.loads(schema.metadata[b"imagenet_parquet"])}
    cut["label_map"]["class_fields"]["wnid"].pop()
    with pytest.raises(FormatError, match=r"shard\.parquet: expected .*class_fields lists as long as the 3 Hugging"):
        own_label_map({**schema.metadata, b"imagenet_parquet": json.dumps(cut).encode()}, "shard.parquet")
