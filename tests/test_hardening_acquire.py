"""Hardening of download / verify (issue 14): credentials refused in params, quarantine of a re-linked corrupt
archive, a cut body without Content-Length, every bad archive in one run, one log line per retry, folder mode
without archives, a replaced source noticed by its stat."""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from tasks.acquire import verify as vf
from tasks.acquire.download import plan
from tasks.acquire.download_json import write_download_json
from tasks.acquire.obtain import fetch_archive, fetch_sample
from tasks.acquire.remote import FetchOptions
from tasks.common import ARCHIVES, PipelineError
from tasks.common.params import validate_params
from tests.helpers.params import _overridden, project
from tests.helpers.servers import RangeServer

FAST = FetchOptions(retries=3, backoff_s=0.01, timeout_s=2.0, chunk_bytes=64 << 10, progress=False)
VAL = ARCHIVES["val"]


@pytest.mark.parametrize("key", ["source", "train", "val", "devkit"])
def test_user_info_in_a_params_url_is_refused_saying_where_credentials_go(key):
    url = "http://user:secret123@127.0.0.1:8000/ilsvrc" + ("" if key == "source" else f"/{VAL}")
    with pytest.raises(PipelineError) as err:
        validate_params(_overridden({"download": {key: url}}))
    message = str(err.value)
    assert f"download.{key}: expected a URL without user info" in message
    assert "~/.netrc" in message and "environment" in message and "fsspec config" in message
    assert "secret123" not in message
    for fine in ("http://127.0.0.1:8000/ilsvrc", "s3://bucket/prefix", "/data/with@sign/ilsvrc"):
        validate_params(_overridden({"download": {key: fine}}))


def _sample_copy(sample_release: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in [*ARCHIVES.values(), "sample_md5.tsv"]:
        shutil.copy2(sample_release / name, dest / name)
    return dest


def _corrupt_copy(src: Path, dest: Path) -> None:
    data = bytearray(src.read_bytes())
    data[len(data) // 2] ^= 0xFF
    dest.write_bytes(bytes(data))


def test_a_relinked_corrupt_archive_is_moved_aside_again_and_old_corrupt_files_go(sample_release, tmp_path):
    source = _sample_copy(sample_release, tmp_path / "source")
    good = (source / VAL).read_bytes()
    _corrupt_copy(sample_release / VAL, source / VAL)
    raw, cache = tmp_path / "raw", tmp_path / "md5_cache.json"
    table = vf.read_md5_table(source / "sample_md5.tsv")
    for _run in range(2):  # the second run hard-links the same corrupt inode as the first run's .corrupt
        fetch_archive(VAL, str(source / VAL), raw, FAST, cache)
        result = vf.check_archive(VAL, raw, table[VAL], cache, "sample", progress=False)
        assert result["ok"] is False and f"moved to {raw / VAL}.corrupt" in result["error"]
        assert not (raw / VAL).exists(), "the bad archive must not stay under its real name"
        assert (raw / f"{VAL}.corrupt").is_file()
    (source / VAL).unlink()  # recovery: an intact copy in the source directory
    (source / VAL).write_bytes(good)
    fetch_archive(VAL, str(source / VAL), raw, FAST, cache)
    assert vf.check_archive(VAL, raw, table[VAL], cache, "sample", progress=False)["ok"] is True
    assert not (raw / f"{VAL}.corrupt").exists(), "the old .corrupt is removed once the archive matches"


def test_quarantine_moves_a_hard_link_of_the_same_inode_as_the_old_corrupt_file(tmp_path):
    source, raw = tmp_path / "bad.tar", tmp_path / "raw"
    source.write_bytes(b"corrupt")
    raw.mkdir()
    os.link(source, raw / f"{VAL}.corrupt")  # left by the first run
    os.link(source, raw / VAL)  # the second run linked the same file again
    corrupt = vf.quarantine(raw / VAL, tmp_path / "c.json")
    assert corrupt == raw / f"{VAL}.corrupt" and corrupt.read_bytes() == b"corrupt"
    assert not (raw / VAL).exists()


def test_verify_names_every_bad_archive_in_one_run(sample_release, tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "md5_cache.json"
    raw.mkdir()
    table = vf.read_md5_table(sample_release / "sample_md5.tsv")
    for name in ARCHIVES.values():
        _corrupt_copy(sample_release / name, raw / name)
    results = {name: vf.check_archive(name, raw, md5, cache, "sample", progress=False) for name, md5 in table.items()
               if name in ARCHIVES.values()}
    with pytest.raises(PipelineError) as err:
        vf.write_verify_json(raw, "sample", results)
    message = str(err.value)
    assert message.startswith("3 of 3 archives do not match")
    assert all(f"{raw / name}: expected MD5 {table[name]}" in message for name in ARCHIVES.values())
    assert all((raw / f"{name}.corrupt").is_file() for name in ARCHIVES.values())
    assert not (raw / "verify.json").exists()


def test_a_cut_body_without_content_length_is_retried_against_heads_size(tmp_path, caplog):
    (tmp_path / "srv").mkdir()
    payload = os.urandom(1 << 20)
    (tmp_path / "srv" / VAL).write_bytes(payload)
    with RangeServer(tmp_path / "srv") as server, caplog.at_level(logging.WARNING):
        server.faults[f"/{VAL}"].extend([("cut", 300_000), ("cut", 200_000)])
        record = fetch_archive(VAL, f"{server.url}/{VAL}", tmp_path / "raw", FAST, tmp_path / "c.json")
        ranges = [r for m, _p, r in server.requests if m == "GET"]
    assert (tmp_path / "raw" / VAL).read_bytes() == payload and record["bytes"] == 1 << 20
    assert ranges == [None, "bytes=300000-", "bytes=500000-"]
    assert "connection closed after 300,000 of 1,048,576 bytes at byte 300,000; retry 1/3" in caplog.text


def test_each_failed_attempt_is_one_short_line(tmp_path, caplog):
    (tmp_path / "srv").mkdir()
    (tmp_path / "srv" / VAL).write_bytes(os.urandom(1 << 20))
    with RangeServer(tmp_path / "srv") as server, caplog.at_level(logging.WARNING):
        server.faults[f"/{VAL}"].extend([("drop", 100_000), ("drop", 100_000)])
        fetch_archive(VAL, f"{server.url}/{VAL}", tmp_path / "raw", FAST, tmp_path / "c.json")
    lines = [r.getMessage() for r in caplog.records if r.name == "tasks.acquire.fetch"]
    assert len(lines) == 2 and all("\n" not in line and len(line) < 160 for line in lines), lines
    assert lines[0].startswith(f"{VAL}: ") and "at byte 100,000; retry 1/3 in 0.0 s" in lines[0]
    assert "at byte 200,000; retry 2/3" in lines[1]
    assert not any("IncompleteRead(" in line or "ProtocolError(" in line for line in lines), lines


def test_folder_mode_builds_no_sample_and_records_the_trees_stat(tmp_path):
    tree = tmp_path / "tree"
    for split in ("train", "val"):
        (tree / split / "n01440764").mkdir(parents=True)
        (tree / split / "n01440764" / "a.JPEG").write_bytes(b"x" * 10)
    proj = project(tmp_path, extract={"mode": "folder", "folder": str(tree)})
    job = plan(proj)
    assert job.sources == {} and not job.uses_sample and job.fetched() == {}
    write_download_json(job.raw_dir, job.source, {}, job.folder)
    raw = job.raw_dir
    assert sorted(p.name for p in raw.iterdir()) == ["download.json"], "no sample archive in folder mode"
    first = (raw / "download.json").read_bytes()
    write_download_json(job.raw_dir, job.source, {}, job.folder)
    assert (raw / "download.json").read_bytes() == first, "an unchanged tree leaves download.json byte-identical"
    table, expected = vf.expected_md5s("auto", raw)
    assert expected == {}
    vf.write_verify_json(raw, table, {})
    assert json.loads((raw / "verify.json").read_text())["folder"] == json.loads(first)["folder"]
    image = tree / "val" / "n01440764" / "a.JPEG"
    image.unlink()
    image.write_bytes(b"y" * 10)  # replaced: same size, new inode
    write_download_json(job.raw_dir, job.source, {}, job.folder)
    assert (raw / "download.json").read_bytes() != first


def test_a_replaced_local_source_is_relinked_and_an_unchanged_one_untouched(sample_release, tmp_path):
    source = _sample_copy(sample_release, tmp_path / "source")
    raw, cache = tmp_path / "raw", tmp_path / "c.json"
    first = fetch_archive(VAL, str(source / VAL), raw, FAST, cache)
    linked = (raw / VAL).stat()
    assert fetch_archive(VAL, str(source / VAL), raw, FAST, cache) == first
    assert (raw / VAL).stat().st_ino == linked.st_ino and (raw / VAL).stat().st_ctime_ns == linked.st_ctime_ns
    (source / VAL).unlink()
    shutil.copy2(sample_release / ARCHIVES["train"], source / VAL)  # rm + cp of another file
    second = fetch_archive(VAL, str(source / VAL), raw, FAST, cache)
    assert os.path.samefile(raw / VAL, source / VAL) and second["md5"] != first["md5"]
    os.utime(source / VAL, ns=(1, 1))  # touched, same bytes: hashed again (no longer provably those bytes) ...
    assert fetch_archive(VAL, str(source / VAL), raw, FAST, cache) == second  # ... and the record is the same


def test_an_intact_sample_is_not_rewritten(tmp_path):
    proj = project(tmp_path)
    job = plan(proj)
    first = fetch_sample(job.raw_dir, job.sample, job.cache_file)
    inodes = {name: (job.raw_dir / name).stat().st_mtime_ns for name in ARCHIVES.values()}
    assert fetch_sample(job.raw_dir, job.sample, job.cache_file) == first
    assert {name: (job.raw_dir / name).stat().st_mtime_ns for name in ARCHIVES.values()} == inodes
