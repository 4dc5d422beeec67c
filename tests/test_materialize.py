"""`python -m imagenet_parquet.materialize` (issue 47): a view (or a whole split) copied onto a node as local shards
holding only its rows — from local shards or straight from the DVC remote (only the view's bytes fetched, counted
on the server) — byte-identical across runs and sources, read by every reader path and by DuckDB, pandas, polars
and Hugging Face `datasets` with the view's labels, and never written over a directory it did not write."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from imagenet_parquet import EvalCrop, ParquetImageDataset, ParquetIterableDataset, RowGroupSampler
from imagenet_parquet.materialize import main, plan_shards
from tests.helpers.project import REPO
from tests.helpers.range_files import serving
from tests.helpers.http_remote import publish
from tests.test_reader_appends import samples, sha_rows
from tests.test_reader_views import kept_bytes, viewed  # noqa: F401  (the fixture)


def _md5s(split_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(split_dir.iterdir())}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "imagenet_parquet.materialize", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=120)


def test_plan_shards_cuts_by_image_bytes():
    assert plan_shards([5, 5, 5, 5, 5], 10) == [(0, 2), (2, 4), (4, 5)]
    assert plan_shards([20, 1], 10) == [(0, 1), (1, 2)] and plan_shards([], 10) == [(0, 0)]


def test_a_view_materialised_holds_its_rows_only_and_every_reader_reads_it(viewed, tmp_path):  # noqa: F811
    root, want = viewed["root"], viewed["want"]["tenth"]
    out = tmp_path / "node"
    assert main([str(out), "--root", str(root), "--split", "train", "--view", "tenth", "--shard-mb", "0.1"]) == 0
    train = out / "train"
    shards = sorted(train.glob("*.parquet"))
    assert len(shards) >= 2  # cut by --shard-mb
    sha = sha_rows(viewed["files"])
    expected = sorted(want["rows"].items())
    ds = ParquetImageDataset(out, "train", decode=False)
    assert sorted(samples((ds[i] for i in range(len(ds))), sha)) == expected
    assert ds.classes == [c["wnid"] for c in want["map"]["classes"]] and ds.overlay is None
    stream = ParquetIterableDataset(out, "train", decode=False, seed=1, batch_size=4)
    assert sorted(samples(stream, sha)) == expected
    assert sorted(samples((ds[i] for i in RowGroupSampler(ds, seed=2)), sha)) == expected
    cropped = ParquetImageDataset(out, "train", crop=EvalCrop(32, resize=40))
    assert tuple(cropped[0][0].shape) == (3, 32, 32)
    # other tools read the labels as stored: the view's
    rows = duckdb.sql(f"SELECT sha256, label FROM read_parquet('{train}/*.parquet')").fetchall()
    assert sorted((sha[h], y) for h, y in rows) == expected
    frame = pq.read_table(shards).to_pandas()
    assert sorted(zip(frame["sha256"].map(sha), frame["label"], strict=True)) == expected
    import polars as pl

    assert pl.read_parquet(f"{train}/*.parquet")["label"].sort().to_list() == sorted(y for _, y in expected)
    from datasets import load_dataset

    hf = load_dataset("parquet", data_files=[str(s) for s in shards], split="train")
    assert hf.features["label"].names == [c["name"] for c in want["map"]["classes"]]
    # bytes on disk: about the view's images, not the dataset's
    on_disk = sum(p.stat().st_size for p in shards)
    dataset = sum(p.stat().st_size for p in viewed["files"])
    assert kept_bytes(viewed["files"], want["rows"]) <= on_disk <= 0.15 * dataset, (on_disk, dataset)
    report = json.loads((train / "materialized.json").read_text())
    assert report["rows"] == len(expected) and report["view"] == "tenth" and "/" not in json.dumps(report["shards"])


def test_the_same_bytes_from_a_second_run_and_from_the_remote_with_only_the_views_bytes_fetched(viewed, tmp_path):  # noqa: F811
    repo, root, want = viewed["repo"], viewed["root"], viewed["want"]["tenth"]
    main([str(tmp_path / "a"), "--root", str(root), "--view", "tenth"])
    main([str(tmp_path / "b"), "--root", str(root), "--view", "tenth"])
    assert _md5s(tmp_path / "a" / "train") == _md5s(tmp_path / "b" / "train")
    publish(repo, tmp_path / "remote", ["data/parquet", "data/overlay", "data/views"])
    with serving(tmp_path / "remote") as (url, log):
        log.clear()
        assert main([str(tmp_path / "c"), "--repo", str(repo), "--remote", url, "--view", "tenth",
                     "--cache-dir", str(tmp_path / "cache"), "--cache-limit", "50MB"]) == 0
    assert _md5s(tmp_path / "c" / "train") == _md5s(tmp_path / "a" / "train")
    sizes = {f"/files/md5/{m[:2]}/{m[2:]}": f.stat().st_size
             for f in viewed["files"] for m in [hashlib.md5(f.read_bytes()).hexdigest()]}
    ranges = [(path, int(a), int(b) + 1) for path, r in log if r and path in sizes
              for a, b in [r.removeprefix("bytes=").split("-")]]
    footers = sum(b - a for path, a, b in ranges if b == sizes[path])  # one tail read a shard (TAIL_BYTES)
    rest = sum(b - a for path, a, b in ranges if b != sizes[path])
    images = kept_bytes(viewed["files"], want["rows"])
    assert footers <= len(sizes) * (1 << 19) and images <= rest <= 1.3 * images, (rest, images)


def test_a_directory_it_did_not_write_is_never_replaced(viewed, tmp_path):  # noqa: F811
    root, out = viewed["root"], tmp_path / "out"
    (out / "train").mkdir(parents=True)
    (out / "train" / "notes.txt").write_text("mine")
    done = _run(str(out), "--root", str(root), "--view", "tenth")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "expected a directory `python -m imagenet_parquet.materialize` wrote" in done.stderr, done.stderr
    assert (out / "train" / "notes.txt").read_text() == "mine" and not list(out.glob(".train.*"))
    (out / "train" / "notes.txt").unlink()
    (out / "train").rmdir()
    assert main([str(out), "--root", str(root), "--view", "tenth"]) == 0
    first = _md5s(out / "train")
    assert main([str(out), "--root", str(root), "--view", "upper"]) == 0  # its own copy: replaced whole
    assert _md5s(out / "train") != first and not list(out.glob(".train.*"))
    (out / "train" / "extra.parquet").write_bytes(b"x")
    done = _run(str(out), "--root", str(root))
    assert done.returncode == 1 and "found other files" in done.stderr and (out / "train" / "extra.parquet").exists()
    missing = _run(str(tmp_path / "x"), "--root", str(root), "--view", "nope")
    assert missing.returncode == 1 and "nope" in missing.stderr and "Traceback" not in missing.stderr
    climbing = _run(str(tmp_path / "x" / "y"), "--root", str(root.parent), "--split", "../parquet/train")
    assert climbing.returncode == 1 and "--split: expected a split name" in climbing.stderr
    assert not (tmp_path / "x").exists()


def test_a_whole_split_materialised_is_the_curated_split(viewed, tmp_path):  # noqa: F811
    root = viewed["root"]
    assert main([str(tmp_path / "all"), "--root", str(root)]) == 0
    sha = sha_rows(viewed["files"])
    local = ParquetImageDataset(root, "train", decode=False)
    copy = ParquetImageDataset(tmp_path / "all", "train", decode=False)
    assert len(copy) == len(local) == 298  # the overlay's two exclusions applied
    assert samples((copy[i] for i in range(len(copy))), sha) == samples((local[i] for i in range(len(local))), sha)
