"""The per-row byte index in each shard's footer (`imagenet_parquet.image_offsets`): convert writes it, the
map-style reader preads through it (falling back to row groups without it), validate checks every entry."""
from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from imagenet_parquet import ParquetImageDataset
from imagenet_parquet.format import IMAGE_INDEX_KEY, decode_image_index, footer_metadata
from imagenet_parquet.indexed import IndexedReader
from tasks.common import PipelineError
from imagenet_parquet import writer as writer_module  # the writer convert and compaction use
from tasks.common import shard_writer as shard_module
from tasks.convert.distribute import run_local
from tasks.validate.stage import run_validation
from tests.helpers.datasets import make_dataset, make_job, sample_dataset, write_shards
from tests.helpers.overlays import write_test_overlay
from tests.helpers.params import validate_section


def _reference(files: list[Path]) -> list[tuple[bytes, int]]:
    rows = [r for f in files for r in pq.read_table(f, columns=["image", "label"]).to_pylist()]
    return [(r["image"]["bytes"], r["label"]) for r in rows]


def _same_rows(ds: ParquetImageDataset, monkeypatch: pytest.MonkeyPatch) -> None:
    """ds[i] equals the row-group path (forced by hiding the index) and the file's rows, in a shuffled order."""
    fallback = ParquetImageDataset(ds.files, decode=False)
    monkeypatch.setattr(fallback._indexed, "_load", lambda path: None)
    expected = _reference(list(ds.files))
    for i in np.random.default_rng(0).permutation(len(ds)).tolist():
        assert ds[i] == fallback[i] == expected[i], i


@pytest.fixture(scope="module")
def converted(sample_release, tmp_path_factory) -> Path:
    """The built-in sample converted with 7-row groups (many row groups per shard); returns the Parquet root."""
    root = tmp_path_factory.mktemp("indexed")
    sample_dataset(root, sample_release)
    job = make_job(root, row_group_rows=7)
    run_local(job, progress=False)
    write_test_overlay(job.parquet)  # what the curate stage writes without curation lines
    return job.parquet


def test_convert_writes_an_exact_index_and_the_reader_preads_through_it(converted, monkeypatch):
    for split in ("train", "val"):
        ds = ParquetImageDataset(converted, split, decode=False)
        for path in ds.files:
            meta = pq.read_metadata(path)
            assert meta.num_row_groups > 1 and IMAGE_INDEX_KEY.encode() in meta.metadata
            index = decode_image_index(meta.metadata, meta.num_rows, path)
            data = path.read_bytes()
            images = pq.read_table(path, columns=["image"]).column("image").combine_chunks().field("bytes")
            assert [data[o:o + n] for o, n in index.tolist()] == images.to_pylist()
        _same_rows(ds, monkeypatch)
        assert ds._reader.cached_units == [] and ds._indexed.open_files == len(ds.files)  # no row group was read
        clone = pickle.loads(pickle.dumps(ds))
        assert clone._indexed.open_files == 0 and clone[3] == ds[3] and clone._indexed.open_files == 1


def test_indexed_dataset_in_a_shuffled_dataloader_with_workers(converted):
    from torch.utils.data import DataLoader

    ds = ParquetImageDataset(converted, "train", decode=False)
    ds[0]  # opened in the parent: the forked workers must reopen their own descriptors
    loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, collate_fn=list)
    seen = sorted(item for batch in loader for item in batch)
    assert seen == sorted(_reference(list(ds.files)))


def test_shards_without_the_index_fall_back_to_row_groups(tmp_path, monkeypatch):
    files = write_shards(tmp_path, total=23, shards=2, row_group_rows=4)
    ds = ParquetImageDataset(files, decode=False)
    _same_rows(ds, monkeypatch)
    assert ds._indexed.open_files == 0 and ds._reader.cached_units  # served by the row-group cache


def test_an_index_pointing_at_other_bytes_is_refused_by_reader_and_validate(tmp_path, monkeypatch):
    ds = make_dataset(tmp_path / "ds").write()
    shard = sorted((ds.parquet_dir / "train").glob("*.parquet"))[0]
    rows = pq.read_table(shard).to_pylist()
    real = writer_module.locate_values

    calls = []

    def swapped(*args):  # rows 0 and 1 of the first row group (the first chunk holding two values) trade entries
        found = real(*args)
        calls.append(len(found) >= 2)
        return [found[1], found[0], *found[2:]] if calls.count(True) == 1 and calls[-1] else found
    monkeypatch.setattr(writer_module, "locate_values", swapped)
    shard_module.write_shard(shard, pq.read_schema(shard), 4, iter(rows))
    checks = {c["name"]: c for c in run_validation(ds.parquet_dir, ds.manifests_dir, ds.label_map_path,
                                                   validate_section())["checks"]}
    assert checks["image_index"]["status"] == "fail" and checks["image_index"]["failures"] == 2
    assert "differ from the row's image.bytes" in checks["image_index"]["message"]
    assert IMAGE_INDEX_KEY in checks["image_index"]["message"]
    assert checks["sha256_match"]["status"] == "pass"  # the stored column itself is intact
    reader = IndexedReader([shard])
    assert reader.read(0, 0)[0] == rows[1]["image"]["bytes"]  # why validate must check it: the prefix matches
    monkeypatch.setattr(writer_module, "locate_values", lambda *a: [(o + 1, n) for o, n in real(*a)])
    shard_module.write_shard(shard, pq.read_schema(shard), 4, iter(rows))
    with pytest.raises(ValueError, match="found other bytes; the shard was altered"):
        IndexedReader([shard]).read(0, 0)
    report = run_validation(ds.parquet_dir, ds.manifests_dir, ds.label_map_path, validate_section())
    check = next(c for c in report["checks"] if c["name"] == "image_index")
    assert check["status"] == "fail" and "where no" in check["message"] and report["status"] == "fail"


def test_validate_passes_indexed_shards_and_names_unindexed_ones(tmp_path):
    ds = make_dataset(tmp_path / "ds").write()
    shard = sorted((ds.parquet_dir / "train").glob("*.parquet"))[0]
    shard_module.write_shard(shard, pq.read_schema(shard), 4, iter(pq.read_table(shard).to_pylist()))
    write_test_overlay(ds.parquet_dir)  # the shard rewritten: curate again
    report = run_validation(ds.parquet_dir, ds.manifests_dir, ds.label_map_path, validate_section())
    check = next(c for c in report["checks"] if c["name"] == "image_index")
    assert report["status"] == "pass" and check["status"] == "pass"
    assert check["message"].startswith("all byte-index entries ok; 2 of 3 shard(s) carry no index")


def test_the_writer_writes_exactly_what_arrow_writes_and_locates_every_value(tmp_path, monkeypatch):
    """IndexingSink only watches the bytes: the shard equals a plain ParquetWriter's file of the same row groups and
    footer, every index entry holds its row's value (repeated images, a value over the 1 MB page size), and a
    writer that stops storing the values verbatim is refused rather than given a wrong index."""
    source = write_shards(tmp_path / "src", total=12, shards=1, row_group_rows=5)[0]
    rows = pq.read_table(source).to_pylist()
    rows[3]["image"] = dict(rows[1]["image"])  # identical bytes twice in one row group
    rows[7]["image"] = {"bytes": rows[7]["image"]["bytes"] + b"\x00" * (3 << 20), "path": "big.JPEG"}
    schema = pq.read_schema(source)
    shard = tmp_path / "shard.parquet"
    count, md5 = shard_module.write_shard(shard, schema, 5, iter(rows))
    meta = pq.read_metadata(shard)
    index = decode_image_index(meta.metadata, meta.num_rows, shard)
    data = shard.read_bytes()
    assert count == 12 and md5 == hashlib.md5(data).hexdigest()
    assert [data[o:o + n] for o, n in index.tolist()] == [r["image"]["bytes"] for r in rows]
    plain = tmp_path / "plain.parquet"
    with pq.ParquetWriter(plain, schema, **writer_module.writer_options()) as writer:
        for first in range(0, len(rows), 5):
            writer.write_table(writer_module.to_table(rows[first:first + 5], schema), row_group_size=5)
        writer.add_key_value_metadata(
            {**footer_metadata(schema), IMAGE_INDEX_KEY: meta.metadata[IMAGE_INDEX_KEY.encode()].decode()}
        )
    assert plain.read_bytes() == data
    options = writer_module.writer_options()
    compressed = {**options, "compression": {**options["compression"], "image.bytes": "zstd"}}
    monkeypatch.setattr(writer_module, "writer_options", lambda: compressed)
    with pytest.raises(PipelineError, match=r"expected image 0 of the row group \(\d+ bytes\) stored verbatim"):
        shard_module.write_shard(tmp_path / "zstd.parquet", schema, 5, iter(rows))
    assert not (tmp_path / "zstd.parquet").exists()  # atomic: nothing under the final name
