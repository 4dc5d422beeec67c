"""download + verify against real servers started here: a faulty Range HTTP server and moto's S3 server."""
from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import pytest

from tasks.acquire import fetch, md5state
from tasks.acquire.download import archive_sources, space_needed
from tasks.acquire.download_json import write_download_json
from tasks.acquire.fetch import RetryableError
from tasks.acquire.local import check_local_sources
from tasks.acquire.obtain import fetch_archive
from tasks.acquire.remote import FetchOptions, redact
from tasks.acquire.space import check_free_space
from tasks.acquire.verify import check_archive, expected_md5s, write_verify_json
from tasks.common import ARCHIVES, PipelineError
from tests.helpers.params import section
from tests.helpers.servers import RangeServer, free_port

FAST = FetchOptions(retries=4, backoff_s=0.01, timeout_s=2.0, chunk_bytes=64 << 10, progress=False)
NAME = ARCHIVES["val"]


@pytest.fixture
def payload(tmp_path: Path) -> Path:
    """A 1 MiB 'archive' behind the HTTP server."""
    src = tmp_path / "srv"
    src.mkdir()
    (src / NAME).write_bytes(os.urandom(1 << 20))
    return src / NAME


@pytest.fixture
def server(payload: Path):
    with RangeServer(payload.parent) as srv:
        yield srv


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _fetch(server: RangeServer, raw: Path, opts: FetchOptions = FAST, path: str = f"/{NAME}") -> dict:
    return fetch_archive(NAME, server.url + path, raw, opts, raw.parent / "md5_cache.json")


def test_three_drops_resume_with_range_and_identical_bytes(server, payload, tmp_path):
    server.faults[f"/{NAME}"].extend([("drop", 100_000), ("drop", 200_000), ("drop", 300_000)])
    record = _fetch(server, tmp_path / "raw")
    out = tmp_path / "raw" / NAME
    assert out.read_bytes() == payload.read_bytes()
    # the content only (no stat, nothing of this machine): the same archive gives the same download.json anywhere
    assert record == {"source": f"{server.url}/{NAME}", "bytes": 1 << 20, "md5": _md5(payload), "method": "http"}
    ranges = [r for m, _p, r in server.requests if m == "GET"]
    assert ranges == [None, "bytes=100000-", "bytes=300000-", "bytes=600000-"]
    assert not out.with_name(NAME + ".part").exists()


def test_server_errors_stall_and_ignored_range_are_retried(server, payload, tmp_path):
    server.faults[f"/{NAME}"].extend([("status", 500), ("stall", 5), ("drop", 5000), ("ignore_range",)])
    opts = FetchOptions(retries=4, backoff_s=0.01, timeout_s=0.5, chunk_bytes=64 << 10, progress=False)
    record = _fetch(server, tmp_path / "raw", opts)
    assert (tmp_path / "raw" / NAME).read_bytes() == payload.read_bytes() and record["md5"] == _md5(payload)


def test_not_found_fails_at_once_with_a_clear_error(server, tmp_path):
    with pytest.raises(PipelineError, match=r"expected the archive, found HTTP 404") as err:
        _fetch(server, tmp_path / "raw", path="/missing.tar")
    assert "download.source" in str(err.value)
    assert [m for m, _p, _r in server.requests] == ["HEAD"]  # a 404 (from HEAD, asked for the size) is not retried
    with pytest.raises(PipelineError, match="found nothing"):
        fetch_archive(NAME, str(tmp_path / "nowhere" / NAME), tmp_path / "raw", FAST, tmp_path / "c.json")
    with pytest.raises(PipelineError, match=r"nowhere/ILSVRC2012_img_train.tar, .*nowhere/ILSVRC2012_img_val.tar, "
                                            r".*nowhere/ILSVRC2012_devkit_t12.tar.gz, found no such files"):
        check_local_sources(archive_sources(section("download", source=str(tmp_path / "nowhere"))))
    assert list((tmp_path / "raw").iterdir()) == []


def test_interrupted_run_keeps_part_and_rerun_completes(server, payload, tmp_path):
    raw = tmp_path / "raw"
    server.faults[f"/{NAME}"].extend([("drop", 250_000), ("status", 503), ("status", 503)])
    opts = FetchOptions(retries=2, backoff_s=0.01, timeout_s=2.0, chunk_bytes=64 << 10, progress=False)
    with pytest.raises(RetryableError, match="re-run `dvc repro` to resume") as err:
        _fetch(server, raw, opts)
    assert "250000 bytes are kept" in str(err.value)
    assert not (raw / NAME).exists() and (raw / f"{NAME}.part").stat().st_size == 250_000
    record = _fetch(server, raw, opts)  # a new process would do the same: the .part is hashed, then resumed
    assert server.requests[-1][2] == "bytes=250000-"
    assert record["md5"] == _md5(payload) and (raw / NAME).read_bytes() == payload.read_bytes()
    before = len(server.requests)
    assert _fetch(server, raw, opts) == record  # unchanged complete download: no request at all
    assert len(server.requests) == before


def test_md5_mismatch_is_quarantined(server, payload, tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "md5_cache.json"
    server.corrupt.add(f"/{NAME}")
    record = _fetch(server, raw)
    assert record["md5"] != _md5(payload)
    result = check_archive(NAME, raw, _md5(payload), cache, "official", progress=False)
    assert result["ok"] is False
    with pytest.raises(PipelineError) as err:
        write_verify_json(raw, "official", {NAME: result})
    message = str(err.value)
    assert str(raw / NAME) in message and _md5(payload) in message and record["md5"] in message
    assert "download the archive again" in message
    assert not (raw / NAME).exists() and (raw / f"{NAME}.corrupt").is_file()


class _FailingWrites:
    """A file whose writes fail with ENOSPC after `room` bytes (a disk filling up mid-download)."""

    def __init__(self, path, mode, buffering=-1, room=150_000):
        self._fh, self._room = open(path, mode, buffering=buffering), room

    def write(self, data):
        if self._fh.tell() + len(data) > self._room:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self._fh.write(data)

    def close(self):
        self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def test_write_failures_leave_no_partial_file(server, tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    monkeypatch.setattr(fetch, "open", _FailingWrites, raising=False)
    with pytest.raises(PipelineError, match=r"No space left on device \(errno 28\)"):
        _fetch(server, raw)
    assert sorted(p.name for p in raw.iterdir()) == []

    def read_only(path, mode, buffering=-1):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(fetch, "open", read_only, raising=False)
    with pytest.raises(PipelineError, match="Read-only file system.*Make .* writable"):
        _fetch(server, raw)
    assert sorted(p.name for p in raw.iterdir()) == []


def test_free_space_is_checked_before_writing(server, tmp_path):
    raw = tmp_path / "raw"
    sources = archive_sources(section("download", source=server.url))
    assert space_needed({NAME: sources[NAME]}, raw, FAST, tmp_path / "c.json") == {NAME: 1 << 20}
    check_free_space(raw, {NAME: 1 << 20})
    with pytest.raises(PipelineError, match=r"needs 1000000\.00 GB free .* found \d+\.\d\d GB free.*"
                                            "300 GB free"):
        check_free_space(raw, {NAME: 10**15})  # an archive larger than any disk here
    assert list(raw.iterdir()) == []


def test_local_sources_are_linked_never_copied(sample_release, tmp_path, monkeypatch):
    raw, cache = tmp_path / "raw", tmp_path / "c.json"
    src = sample_release / NAME
    record = fetch_archive(NAME, str(src), raw, FAST, cache)
    assert record["link"] == "hardlink" and os.path.samefile(raw / NAME, src)
    assert record["method"] == "local" and record["md5"] == _md5(src)  # hashed once, in the pass that indexes it
    assert fetch_archive(NAME, src.as_uri(), raw, FAST, cache)["link"] == "hardlink"

    def cross_device(*_args):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    (raw / NAME).unlink()  # a link already in place is kept as it is

    monkeypatch.setattr(os, "link", cross_device)
    record = fetch_archive(NAME, str(src), raw, FAST, cache)
    assert record["link"] == "symlink" and (raw / NAME).resolve() == src.resolve()
    assert record["bytes"] == src.stat().st_size and src.stat().st_nlink >= 1


def test_credentials_are_redacted(server, payload, tmp_path, caplog):
    url = server.url.replace("http://", "http://alice:s3cret@") + f"/{NAME}?X-Amz-Signature=topsecret"
    server.faults[f"/{NAME}"].append(("drop", 1000))
    record = fetch_archive(NAME, url, tmp_path / "raw", FAST, tmp_path / "c.json")
    write_download_json(tmp_path / "raw", url, {NAME: record})
    text = (tmp_path / "raw" / "download.json").read_text() + caplog.text
    assert "s3cret" not in text and "topsecret" not in text and "***@127.0.0.1" in text
    dead = f"http://alice:s3cret@127.0.0.1:{free_port()}/{NAME}?X-Amz-Signature=topsecret"  # nobody listens
    opts = FetchOptions(retries=1, backoff_s=0.01, timeout_s=1.0, chunk_bytes=1 << 16, progress=False)
    with pytest.raises(RetryableError) as err:
        fetch_archive(NAME, dead, tmp_path / "raw2", opts, tmp_path / "c.json")
    assert "Connection" in str(err.value) and "s3cret" not in str(err.value) + caplog.text
    assert "topsecret" not in str(err.value) + caplog.text and "retry 1/1" in caplog.text
    assert redact("s3://bucket/x.tar") == "s3://bucket/x.tar"


def test_s3_through_moto(payload, tmp_path, monkeypatch):
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    moto.start()
    try:
        for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}.items():
            monkeypatch.setenv(key, value)
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="ilsvrc")
        s3.put_object(Bucket="ilsvrc", Key=f"releases/{NAME}", Body=payload.read_bytes())
        import fsspec

        fsspec.filesystem("s3").invalidate_cache()
        sources = archive_sources(section("download", source="s3://ilsvrc/releases"))
        assert sources[NAME] == f"s3://ilsvrc/releases/{NAME}"
        raw = tmp_path / "raw"
        assert space_needed({NAME: sources[NAME]}, raw, FAST, tmp_path / "c.json") == {NAME: 1 << 20}
        record = fetch_archive(NAME, sources[NAME], raw, FAST, tmp_path / "c.json")
        assert record == {"source": sources[NAME], "bytes": 1 << 20, "md5": _md5(payload), "method": "fsspec"}
        with pytest.raises(PipelineError, match="found nothing there"):
            fetch_archive(NAME, "s3://ilsvrc/releases/missing.tar", raw, FAST, tmp_path / "c.json")
    finally:
        moto.stop()


def test_verify_reuses_the_streamed_md5_and_rehashes_a_changed_file(server, payload, tmp_path, monkeypatch):
    raw, cache = tmp_path / "raw", tmp_path / "md5_cache.json"
    record = _fetch(server, raw)
    real_pass = md5state.hash_and_index  # the val archive: hashed in the pass that also indexes its tar headers

    def counting(path, *args, **kwargs):
        counting.calls.append(Path(path).name)
        return real_pass(path, *args, **kwargs)

    counting.calls = []
    monkeypatch.setattr(md5state, "hash_and_index", counting)
    result = check_archive(NAME, raw, record["md5"], cache, "custom", progress=False)
    assert result["md5_from"] == f"download {server.url}/{NAME}" and counting.calls == []
    os.utime(raw / NAME, ns=(1, 1))  # touched: no longer provably the bytes that were hashed
    assert check_archive(NAME, raw, record["md5"], cache, "custom", progress=False)["md5_from"] == "computed"
    assert check_archive(NAME, raw, record["md5"], cache, "custom", progress=False)["md5_from"] == "verify"
    assert counting.calls == [NAME]
    write_verify_json(raw, "custom", {NAME: result})
    assert json.loads((raw / "verify.json").read_text()) == {
        "archives": {NAME: {"md5": record["md5"], "expected": record["md5"], "bytes": 1 << 20, "ok": True}},
        "checksums": "custom"}


def test_checksum_tables(sample_release, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "verify.json").write_text("{}")
    table, expected = expected_md5s("official", raw)
    assert table == "official" and expected[ARCHIVES["train"]] == "1d675b47d978889d74fa0da5fadfb00e"
    assert not (raw / "verify.json").exists()
    assert expected_md5s(str(sample_release / "sample_md5.tsv"), raw)[1] == {
        n: _md5(sample_release / n) for n in ARCHIVES.values()}
    (tmp_path / "bad.tsv").write_text("name\tmd5\nILSVRC2012_img_val.tar\t" + "0" * 32 + "\n")
    with pytest.raises(PipelineError, match="expected a row for ILSVRC2012_devkit_t12.tar.gz"):
        expected_md5s(str(tmp_path / "bad.tsv"), raw)
    with pytest.raises(PipelineError, match="found no such file"):
        expected_md5s("sample", raw)
