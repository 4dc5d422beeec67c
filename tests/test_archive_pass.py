"""One read for verify + extract (issue 11): an archive's MD5 and its tar index come from one sequential pass
(tasks.common.archive_pass), and the extract stage uses that index only for the very bytes verify accepted."""

from __future__ import annotations

import hashlib
import os
import shutil

import pyarrow.parquet as pq
import pytest

from tasks.acquire import md5state
from tasks.acquire.obtain import fetch_archive
from tasks.acquire.remote import FetchOptions
from tasks.common import ARCHIVES, SPLITS, PipelineError
from tasks.common import archive_pass as ap
from tasks.common.tarindex import index_nested, index_tar
from tasks.extract import stage as extract
from tests.helpers.servers import RangeServer
from tests.test_extract_safety import ZOO, _build

FAST = FetchOptions(retries=4, backoff_s=0.01, timeout_s=2.0, chunk_bytes=64 << 10, progress=False)
INDEX = {"train": index_nested, "val": index_tar}


def _md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture
def reads(monkeypatch):
    """Bytes read through os.read and os.pread while the test runs."""
    seen = {"read": 0, "pread": 0}
    real_read, real_pread = os.read, os.pread

    def read(fd, n):
        data = real_read(fd, n)
        seen["read"] += len(data)
        return data

    def pread(fd, n, offset):
        data = real_pread(fd, n, offset)
        seen["pread"] += len(data)
        return data

    monkeypatch.setattr(os, "read", read)
    monkeypatch.setattr(os, "pread", pread)
    return seen


@pytest.mark.parametrize("block", [8 << 20, 1 << 16, 4096, 700, 100])
def test_one_pass_gives_the_md5_and_the_same_index_reading_each_byte_once(sample_release, reads, block):
    for split in SPLITS:
        path = sample_release / ARCHIVES[split]
        expected = INDEX[split](path, split, "src")
        reads.update(read=0, pread=0)
        with ap.SequentialView(path, block=block) as view:
            got = INDEX[split](path, split, "src", fileobj=view)
            md5 = view.finish()
        assert got == expected and md5 == _md5(path)
        if block >= 1 << 16:  # tarfile's reads fit in the two blocks kept: nothing is read twice
            assert reads == {"read": path.stat().st_size, "pread": 0}


@pytest.mark.parametrize("case", sorted(c for c in ZOO if ZOO[c][1] != ARCHIVES["devkit"]))
def test_a_refused_member_is_still_hashed_to_the_end_and_leaves_no_prescan(tmp_path, case):
    spec, archive, _member, why = ZOO[case]
    raw = tmp_path / "raw"
    _build(raw, spec)
    split = next(s for s in SPLITS if ARCHIVES[s] == archive)
    with pytest.raises(PipelineError, match=why) as walked:
        INDEX[split](raw / archive, split, "")
    found = ap.hash_and_index(raw / archive, split, "", progress=False)
    assert found.md5 == _md5(raw / archive) and found.entries is None
    assert found.refused == str(walked.value)  # the extract stage, walking it again, fails with the same message
    ap.save_prescan(tmp_path / "prescan", split, raw / archive, found, ap.stat_key(raw / archive))
    assert ap.load_prescan(tmp_path / "prescan", split, raw / archive, found.md5) is None


def test_a_prescan_is_used_only_for_the_same_file_and_the_verified_md5(sample_release, tmp_path, monkeypatch):
    raw, prescan = tmp_path / "raw", tmp_path / "prescan"
    raw.mkdir()
    path = shutil.copy(sample_release / ARCHIVES["train"], raw / ARCHIVES["train"])
    found = ap.hash_and_index(path, "train", "", progress=False)
    ap.save_prescan(prescan, "train", path, found, ap.stat_key(path))
    table, reported = ap.load_prescan(prescan, "train", path, found.md5)
    assert table.num_rows == len(found.entries) == 200 and reported == found.reported
    assert ap.load_prescan(prescan, "train", path, "0" * 32) is None, "not the MD5 verify accepted"
    assert ap.load_prescan(prescan, "train", path, None) is None, "no verify.json"
    assert ap.load_prescan(prescan, "val", path, found.md5) is None, "another split"
    monkeypatch.setattr(ap, "SCANNER", ap.SCANNER + 1)
    assert ap.load_prescan(prescan, "train", path, found.md5) is None, "made by older indexing rules"
    monkeypatch.undo()
    os.utime(path, ns=(1, 1))  # touched since the pass: no longer provably the bytes indexed
    assert ap.load_prescan(prescan, "train", path, found.md5) is None
    key = ap.stat_key(path)
    os.utime(path, ns=(2, 2))
    ap.save_prescan(prescan, "train", path, found, key)  # changed during the pass: nothing is kept
    assert not ap.prescan_paths(prescan, "train")[1].exists()


def test_extract_from_the_prescan_writes_the_same_staging_index(sample_release, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in SPLITS:
        path = shutil.copy(sample_release / ARCHIVES[split], raw / ARCHIVES[split])
        found = ap.hash_and_index(path, split, "", progress=False)
        ap.save_prescan(tmp_path / "prescan", split, path, found, ap.stat_key(path))
        prescan = ap.load_prescan(tmp_path / "prescan", split, path, found.md5)
        walked = extract.scan_archive_split(split, path, tmp_path / "walked", root=tmp_path)
        reused = extract.scan_archive_split(split, path, tmp_path / "reused", root=tmp_path, prescan=prescan)
        assert pq.read_table(reused).equals(pq.read_table(walked))
        assert (reused.with_suffix(".scan.json")).read_bytes() == (walked.with_suffix(".scan.json")).read_bytes()


def _serve(sample_release, server_root):
    server_root.mkdir()
    for split in SPLITS:
        os.link(sample_release / ARCHIVES[split], server_root / ARCHIVES[split])
    return RangeServer(server_root)


def test_a_download_indexes_the_archive_as_it_arrives_across_resumes(sample_release, tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "scratch" / "md5_cache.json"
    with _serve(sample_release, tmp_path / "srv") as server:
        server.faults[f"/{ARCHIVES['train']}"].extend([("drop", 3_000_000), ("drop", 2_000_000)])
        server.faults[f"/{ARCHIVES['val']}"].append(("drop", 700_000))
        for split in SPLITS:
            name = ARCHIVES[split]
            record = fetch_archive(name, f"{server.url}/{name}", raw, FAST, cache)
            assert record["md5"] == _md5(raw / name) == _md5(sample_release / name)
            prescan = ap.load_prescan(md5state.prescan_dir(cache), split, raw / name, record["md5"])
            assert prescan is not None, split
            walked = INDEX[split](raw / name, split, "")
            assert prescan[0].to_pylist() == [{k: getattr(e, k) for k in ap.PRESCAN_SCHEMA.names} for e in walked[0]]
            assert prescan[1] == walked[1]
        gets = [r for m, p, r in server.requests if m == "GET" and p.endswith(ARCHIVES["train"])]
        assert gets == [None, "bytes=3000000-", "bytes=5000000-"]  # resumed twice, indexed all the same


def test_a_stream_that_restarts_or_a_devkit_leaves_no_prescan(sample_release, tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "scratch" / "md5_cache.json"
    with _serve(sample_release, tmp_path / "srv") as server:
        server.faults[f"/{ARCHIVES['val']}"].extend([("drop", 700_000), ("ignore_range",)])  # 200 + the whole file
        record = fetch_archive(ARCHIVES["val"], f"{server.url}/{ARCHIVES['val']}", raw, FAST, cache)
    assert record["md5"] == _md5(sample_release / ARCHIVES["val"])  # the download itself is right ...
    prescan = md5state.prescan_dir(cache)
    assert ap.load_prescan(prescan, "val", raw / ARCHIVES["val"], record["md5"]) is None  # ... but not indexed
    assert not ap.prescan_paths(prescan, "val")[1].exists()
