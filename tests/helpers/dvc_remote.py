"""A real DVC project whose Parquet shards are pushed to a directory remote, and a clone of it that never pulls
(the remote reader's tests: tests/test_reader_remote*.py)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq

from tasks.common.shard_writer import ShardWriter
from tests.helpers.datasets import write_shards
from tests.helpers.project import GIT

TOTAL = 60


def run(cmd: list[str], cwd: Path) -> None:
    out = subprocess.run(cmd, cwd=cwd, env={**os.environ, "DVC_NO_ANALYTICS": "1"}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, f"{cmd}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"


def build_project(root: Path) -> dict[str, Path]:
    """{"repo", "remote", "node"}: a DVC project whose `data/parquet` (train: 3 shards of 5-row groups with the
    footer byte index, val: 1 shard) is a stage out in dvc.lock, pushed to `remote`; `node` is a git clone of it."""
    repo, remote = root / "repo", root / "remote"
    repo.mkdir()
    run(["git", "init", "-q"], repo)
    run(["dvc", "init", "-q"], repo)
    for split, total, shards in (("train", TOTAL, 3), ("val", 9, 1)):
        for path in write_shards(repo / "data" / "parquet", split, total=total, shards=shards, row_group_rows=5):
            table = pq.read_table(path)  # rewritten as convert writes: with the footer's byte index
            ShardWriter(path, table.schema, 5).write(iter(table.to_pylist()))
    (repo / "data" / "parquet" / "label_map.json").unlink()
    run(["dvc", "stage", "add", "-q", "-n", "convert", "-o", "data/parquet", "true"], repo)
    run(["dvc", "commit", "-q", "-f"], repo)
    run(["dvc", "remote", "add", "-d", "store", str(remote)], repo)
    run(["dvc", "push", "-q"], repo)
    run(["git", "add", "-A"], repo)
    run([*GIT, "commit", "-qm", "shards"], repo)
    run(["git", "clone", "-q", str(repo), str(root / "node")], root)
    assert not (root / "node" / "data" / "parquet").exists()  # never pulled
    return {"repo": repo, "remote": remote, "node": root / "node"}
