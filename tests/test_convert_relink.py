"""Shards put back by link (tasks/convert/relink.py): DVC deletes the Parquet directory before convert runs (it is
not a `persist` out), and convert links back the shards the layout history lists from the DVC cache (by the listed
md5, size checked; copied where no link can be made) and a killed run's finished shards from their resume links."""
from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tasks.convert import relink
from tests.helpers.datasets import make_job


@pytest.fixture()
def dvc_repo(tmp_path: Path) -> Path:
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True, timeout=60,
                   env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    return tmp_path


def _cache(repo: Path, data: bytes) -> tuple[str, Path]:
    md5 = hashlib.md5(data).hexdigest()
    path = repo / ".dvc/cache/files/md5" / md5[:2] / md5[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o444)
    return md5, path


def _entry(name: str, md5: str, size: int) -> dict:
    return {"name": name, "md5": md5, "file_bytes": size, "rows": 1, "image_bytes": 1, "input_bytes": 1}


def test_listed_shards_are_linked_back_from_the_dvc_cache_only_by_md5_and_size(dvc_repo):
    job = make_job(dvc_repo)
    shards = job.parquet / "train"
    md5, cached = _cache(dvc_repo, b"shard a" * 100)
    other_md5, _ = _cache(dvc_repo, b"shard b" * 100)
    entries = [
        _entry("train-ha.parquet", md5, 700),
        _entry("train-hb.parquet", other_md5, 999),  # another size than the cache file's: not linked
        _entry("train-hc.parquet", "0" * 32, 10),  # not in the cache
        _entry("train-hd.parquet", "../../../../params", 10),  # not an md5: never a path
    ]
    assert len(relink.restore_listed(job, {"train": entries})) == 1
    assert (shards / "train-ha.parquet").samefile(cached)
    assert sorted(p.name for p in shards.iterdir()) == ["train-ha.parquet"]
    assert len(relink.restore_listed(job, {"train": entries[:1]})) == 0  # present: nothing to do


def test_a_cache_on_another_filesystem_is_copied_under_a_temporary_name(dvc_repo, monkeypatch):
    job = make_job(dvc_repo)
    shards = job.parquet / "train"
    md5, cached = _cache(dvc_repo, b"shard a" * 100)

    def cross_device(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(relink.os, "link", cross_device)
    assert len(relink.restore_listed(job, {"train": [_entry("train-ha.parquet", md5, 700)]})) == 1
    restored = shards / "train-ha.parquet"
    assert restored.read_bytes() == cached.read_bytes() and not restored.samefile(cached)
    assert [p.name for p in shards.iterdir()] == ["train-ha.parquet"]  # no temporary left


def test_a_finished_shard_comes_back_from_its_resume_link_and_a_listed_one_when_its_stats_agree(tmp_path):
    job = make_job(tmp_path)
    shards, scratch = job.parquet / "train", job.scratch("train")
    shards.mkdir(parents=True)
    scratch.mkdir(parents=True)
    shard = shards / "train-g1-hx.parquet"
    shard.write_bytes(b"x" * 50)
    relink.keep(shard, scratch / shard.name)
    inode = shard.stat().st_ino
    shard.unlink()  # what `dvc repro` does to the directory before convert runs
    relink.restore_finished(scratch / shard.name, shard)
    assert shard.stat().st_ino == inode
    shard.unlink()
    md5 = hashlib.md5(b"x" * 50).hexdigest()
    (scratch / "train-g1-hx.json").write_text('{"md5": "%s"}' % ("f" * 32))  # stats of other bytes: not used
    assert len(relink.restore_listed(job, {"train": [_entry(shard.name, md5, 50)]})) == 0  # (no DVC repo here)
    (scratch / "train-g1-hx.json").write_text('{"md5": "%s"}' % md5)
    assert len(relink.restore_listed(job, {"train": [_entry(shard.name, md5, 50)]})) == 1
    assert shard.stat().st_ino == inode
