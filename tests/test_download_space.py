"""The download stage's free-space check counts the .tar an archive21k .tar.gz is decompressed into (about the
.tar.gz's size: JPEGs do not compress), before anything is written; not once that .tar is there, intact."""
from __future__ import annotations

import gzip
import os
from collections import namedtuple

import pytest

from tasks.acquire import archive21k, space
from tasks.acquire.download import space_needed
from tasks.acquire.remote import FetchOptions
from tasks.acquire.space import check_free_space
from tasks.common import PipelineError
from tests.helpers.archives import tar_bytes
from tests.helpers.servers import RangeServer

FAST = FetchOptions(retries=1, backoff_s=0.01, timeout_s=2.0, chunk_bytes=64 << 10, progress=False)
LAYOUT = {"archive": "w.tar.gz", "tar": "w.tar"}
TAR_KEY = "w.tar (decompressed from w.tar.gz, about as large)"


def _gz(directory):
    directory.mkdir(parents=True, exist_ok=True)
    inner = tar_bytes([("n00000001_1.JPEG", os.urandom(100_000))])  # random bytes: the gzip is about as large
    gz = directory / "w.tar.gz"
    gz.write_bytes(gzip.compress(tar_bytes([("n00000001.tar", inner)]), mtime=0))
    return gz


def test_a_local_tar_gz_needs_room_for_its_tar_until_it_is_decompressed(tmp_path):
    gz, raw, cache = _gz(tmp_path / "src"), tmp_path / "raw", tmp_path / "c.json"
    sources = {"w.tar.gz": str(gz)}
    assert space_needed(sources, raw, FAST, cache) == {}  # (without the layout: a linked file needs nothing)
    assert space_needed(sources, raw, FAST, cache, LAYOUT, tmp_path) == {TAR_KEY: gz.stat().st_size}
    archive21k.fetch_gzipped("w.tar.gz", str(gz), raw, FAST, cache, tmp_path)
    assert (raw / "w.tar").is_file() and space_needed(sources, raw, FAST, cache, LAYOUT, tmp_path) == {}
    (raw / "w.tar").unlink()  # gone: it will be written again
    assert space_needed(sources, raw, FAST, cache, LAYOUT, tmp_path) == {TAR_KEY: gz.stat().st_size}


def test_a_downloaded_tar_gz_needs_room_for_itself_and_its_tar(tmp_path):
    gz = _gz(tmp_path / "srv")
    with RangeServer(tmp_path / "srv") as server:
        needed = space_needed({"w.tar.gz": f"{server.url}/w.tar.gz"}, tmp_path / "raw", FAST, tmp_path / "c.json",
                                 LAYOUT)
    assert needed == {"w.tar.gz": gz.stat().st_size, TAR_KEY: gz.stat().st_size}


def test_too_little_space_for_the_tar_fails_before_writing_naming_it(tmp_path, monkeypatch):
    gz, raw = _gz(tmp_path / "src"), tmp_path / "raw"
    needed = space_needed({"w.tar.gz": str(gz)}, raw, FAST, tmp_path / "c.json", LAYOUT, tmp_path)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(space.shutil, "disk_usage", lambda _p: usage(1 << 40, 0, space.SPACE_MARGIN))
    with pytest.raises(PipelineError, match=rf"{raw}: writing w\.tar \(decompressed from w\.tar\.gz, about as "
                                            r"large\) needs 0\.00 GB free \(\+ 64 MiB margin\), found 0\.07 GB free"):
        check_free_space(raw, needed)
    assert list(raw.iterdir()) == []
