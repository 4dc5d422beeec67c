"""Validate at scale: shards checked in parallel (`validate.workers`), the same report whatever the worker count,
each shard's bytes read once (the byte-index check compares against the bytes already read), progress shown."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from tasks.common.progress import EVERY_ENV
from tasks.common import shard_writer as shard_module
from tasks.validate import scan
from tasks.validate.scan import ShardScan, read_metadata, scan_shard
from tasks.validate.stage import run_validation
from tests.helpers.datasets import make_dataset, set_bytes, small_jpeg, write_shards
from tests.helpers.params import validate_section


def _rchar() -> int:
    return int(next(line for line in Path("/proc/self/io").read_text().splitlines()
                    if line.startswith("rchar")).split()[1])


def test_the_report_is_the_same_with_one_or_several_workers(tmp_path, monkeypatch, capsys):
    ds = make_dataset(tmp_path / "ds", classes=4, train_per_class=6, val_per_class=2)
    ds.shards = {"train": 4, "val": 2}
    set_bytes(ds.rows["train"][3], small_jpeg(999), rehash=False)  # a sha256 mismatch in the first train shard
    set_bytes(ds.rows["val"][-1], b"GIF89a not a jpeg")  # not a JPEG, undecodable, in the last val shard
    ds.write()
    for shard in sorted((ds.parquet_dir / "train").glob("*.parquet"))[1:]:  # byte-indexed, as convert writes them
        shard_module.write_shard(shard, pq.read_schema(shard), 4, iter(pq.read_table(shard).to_pylist()))
    monkeypatch.setenv(EVERY_ENV, "0")
    monkeypatch.setattr(scan, "POOL_MIN_BYTES", 0)  # a pool even for this tiny dataset
    reports = [run_validation(ds.parquet_dir, ds.manifests_dir, ds.label_map_path, validate_section(workers=w))
               for w in (1, 3, "auto")]
    assert reports[0] == reports[1] == reports[2]
    checks = {c["name"]: c for c in reports[0]["checks"]}
    assert checks["sha256_match"]["failures"] == 1 and checks["jpeg_soi"]["failures"] == 1
    assert checks["decode"]["failures"] == 1 and checks["image_index"]["status"] == "pass"
    assert "1 of 6 shard(s) carry no index" not in checks["image_index"]["message"]
    assert "validate: done, 32 img in" in capsys.readouterr().err  # progress, readable without a terminal


def test_each_shard_is_read_once(tmp_path):
    files = write_shards(tmp_path, total=60, shards=1, row_group_rows=10, noise_px=48)
    shard = files[0]
    shard_module.write_shard(shard, pq.read_schema(shard), 10, iter(pq.read_table(shard).to_pylist()))
    meta, plan = read_metadata({"train": [shard], "val": []})
    job = ShardScan("train", shard, 0, 60, meta["sha256"].to_numpy(), meta[["width", "height"]].to_numpy(),
                    meta["label"].to_numpy() < 0)
    before = _rchar()
    found = scan_shard(job)
    read = _rchar() - before
    assert not (found.hash_mismatch or found.index_mismatch or found.not_jpeg) and found.unindexed == []
    images = found.image_bytes["train"]
    assert images > 60 * 3000 and read < 1.5 * images, (read, images)  # twice before: row groups + a pread per row


def test_the_contact_sheet_reads_only_the_pictured_images(tmp_path):
    from tasks.validate.contact_sheet import picked_bytes

    files = write_shards(tmp_path, total=60, shards=1, row_group_rows=30, noise_px=48)
    plain = files[0]
    indexed = tmp_path / "indexed.parquet"
    shard_module.write_shard(indexed, pq.read_schema(plain), 30, iter(pq.read_table(plain).to_pylist()))
    images = pq.read_table(plain, columns=["image"]).column("image").combine_chunks().field("bytes").to_pylist()
    wanted = {3, 25, 59}
    for path in (plain, indexed):  # a shard without the byte index: from the row groups holding the rows
        assert {row: bytes(data) for row, data in picked_bytes(path, wanted)} == {r: images[r] for r in wanted}
    reads = {}
    for path in (plain, indexed):
        before = _rchar()
        list(picked_bytes(path, wanted))
        reads[path] = _rchar() - before
    pictured = sum(len(images[r]) for r in wanted)
    assert reads[plain] > 60 * 3000, "both 30-row groups"
    assert reads[indexed] < pictured + 80 * 1024, (reads, pictured)  # footer (pyarrow reads 64 KiB) + 3 preads
