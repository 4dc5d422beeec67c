"""Hash once (issue 11): convert computes each shard's MD5 from the bytes as it writes them and hands it to DVC's
state database, so `dvc repro` does not read data/parquet again to hash it; a file changed since is left to DVC."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from tasks.common.dvc_state import open_repo, stat_key, state_get, state_put
from tasks.common.shard_writer import write_shard
from tests.helpers.datasets import write_shards


def _rewritten(tmp_path: Path, name: str = "shard.parquet") -> tuple[Path, str]:
    source = write_shards(tmp_path / "src", total=23, shards=1, row_group_rows=5, noise_px=32)[0]
    shard = tmp_path / name
    _, md5 = write_shard(shard, pq.read_schema(source), 5, iter(pq.read_table(source).to_pylist()))
    return shard, md5


def test_the_writer_md5_is_the_md5_of_the_file_it_wrote(tmp_path):
    shard, md5 = _rewritten(tmp_path)
    assert md5 == hashlib.md5(shard.read_bytes()).hexdigest()
    assert pq.read_metadata(shard).num_row_groups == 5  # several row groups and the footer all in the hash


def test_md5s_reach_dvcs_state_only_for_unchanged_files(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=repo, check=True)
    shard, md5 = _rewritten(repo)
    other, other_md5 = _rewritten(repo, "other.parquet")
    key = stat_key(other)
    os.utime(other, ns=(key["mtime_ns"] + 10**9, key["mtime_ns"] + 10**9))  # changed after it was hashed
    assert state_put([(shard, md5, stat_key(shard)), (other, other_md5, key)]) == 1
    assert state_get(shard) == md5  # DVC finds it: no read of the shard
    assert state_get(other) is None  # stale: DVC hashes it itself
    assert open_repo(tmp_path / "outside.parquet") is None  # no DVC repo above: nothing imported, nothing saved
    assert state_put([(tmp_path / "src" / "x", md5, {})]) == 0
