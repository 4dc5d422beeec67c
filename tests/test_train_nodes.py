"""examples/train.py on two nodes (issue 47): `torchrun --nnodes 2 --nproc-per-node 2` twice on 127.0.0.1 (node ranks
0 and 1, CPU, gloo), streaming from a real DVC remote — an HTTP Range server per node and moto's S3 server, each
counting the bytes it sends — through one cache directory per node. Each node fetches about its half of the row
groups (not all of them), epoch 2 fetches nothing, every step's images are disjoint across the four ranks and an
epoch covers the shards once; a run preempted on two nodes resumes on one with every remaining image exactly once
and the same global steps as the uninterrupted run."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from imagenet_parquet.shards import row_group_span
from imagenet_parquet.writer import ShardWriter
from tests.helpers.datasets import write_shards
from tests.helpers.http_remote import publish
from tests.helpers.project import REPO
from tests.helpers.servers import CountingMotoServer, RangeServer, free_port

pytest.importorskip("torchdata.stateful_dataloader")
pytestmark = pytest.mark.slow

TOTAL, BATCH, WORLD, C, K = 320, 8, 4, 4, 4  # 10 global steps of 32 an epoch; the cut run stops after K steps
# C = 4 canonical partitions of 80 rows: 5 whole row groups each (at scale the groups cut at their bounds are
# ~C of ~13,000: benchmarks/bench_nodes.py)
BIN = Path(sys.executable).parent
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def remote(tmp_path_factory) -> dict[str, object]:
    """A checkout whose data/parquet (4 train shards of 16-row groups, the footer byte index) is in a directory
    DVC remote; the row groups' (object path, first, end) and every image's label by id (its sha256)."""
    root = tmp_path_factory.mktemp("nodes")
    repo, store = root / "repo", root / "remote"
    groups, labels = {}, {}
    for path in write_shards(repo / "data" / "parquet", "train", total=TOTAL, classes=10, shards=4, row_group_rows=16):
        table = pq.read_table(path)
        ShardWriter(path, table.schema, 16).write(iter(table.to_pylist()))
        labels.update(zip(table.column("sha256").to_pylist(), table.column("label").to_pylist(), strict=True))
    (repo / "data" / "parquet" / "label_map.json").unlink()
    publish(repo, store, ["data/parquet"])
    import hashlib

    for path in sorted((repo / "data/parquet/train").glob("*.parquet")):
        md5, meta = hashlib.md5(path.read_bytes()).hexdigest(), pq.read_metadata(path)
        for g in range(meta.num_row_groups):
            groups[(f"/files/md5/{md5[:2]}/{md5[2:]}", *row_group_span(meta, g))] = f"{path.name}:{g}"
    return {"repo": repo, "store": store, "groups": groups, "labels": labels}


def _row_group_bytes(served_ranges: list[tuple[str, str | None]], groups) -> tuple[int, Counter[str]]:
    """Bytes of the row-group requests among `served_ranges` [(path, Range)], and how often each group was asked."""
    total, asked = 0, Counter()
    for path, rng in served_ranges:
        if rng:
            first, last = (int(x) for x in rng.removeprefix("bytes=").split("-"))
            if (path, first, last + 1) in groups:
                total += last + 1 - first
                asked[groups[(path, first, last + 1)]] += 1
    return total, asked


def torchrun(repo: Path, out: Path, nnodes: int, remotes: list[str], *args: str, env: dict | None = None) -> list[dict]:
    """examples/train.py on `nnodes` nodes of 2 processes each (one torchrun per node, node i reading `remotes[i]`),
    all on 127.0.0.1; the step log sorted by (global step, rank)."""
    log, port = out.with_suffix(".jsonl"), free_port()
    base = {**os.environ, **(env or {}), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    procs, logs = [], [out.with_name(f"{out.name}-node{node}.log") for node in range(nnodes)]
    for node in range(nnodes):
        launch = [str(BIN / "torchrun"), f"--nnodes={nnodes}", f"--node-rank={node}", "--nproc-per-node=2",
                  "--master-addr=127.0.0.1", f"--master-port={port}"]
        cmd = [*launch, str(REPO / "examples" / "train.py"), "--repo", str(repo), "--data", "data/parquet",
               "--remote", remotes[node], "--cache-dir", str(out.parent / (out.name + "-cache-{node}")),
               "--canonical-nodes", str(C), "--batch-size", str(BATCH), "--num-workers", "1", "--seed", "5",
               "--step-log", str(log), *args]
        with logs[node].open("w") as sink:  # a file, not a pipe: what a node printed is there even if it hangs
            procs.append(subprocess.Popen(cmd, cwd=out.parent, env=base, stdout=sink, stderr=subprocess.STDOUT,
                                          start_new_session=True))  # its own group: killed whole below
    deadline, codes = time.monotonic() + 300, []
    try:
        codes = [p.wait(max(1.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        pass
    finally:  # a node that never ends takes its workers with it
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
    for node, path in enumerate(logs):
        text = path.read_text(errors="replace")
        assert len(codes) == nnodes and codes[node] == 0 and "Traceback" not in text, f"node {node}: {text[-6000:]}"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return sorted(records, key=lambda r: (r["global_step"], r["rank"]))


def _steps(records: list[dict]) -> dict[tuple[int, int], list[str]]:
    """(epoch, step) -> the sorted ids of the global step (every rank's batch)."""
    steps: dict[tuple[int, int], list[str]] = defaultdict(list)
    for r in records:
        steps[r["epoch"], r["step"]] += r["ids"]
    return {k: sorted(v) for k, v in steps.items()}


def test_two_nodes_from_http_fetch_their_halves_once_and_a_resume_on_one_node_sees_the_rest(remote, tmp_path):
    servers = [RangeServer(remote["store"]), RangeServer(remote["store"])]  # one per node: bytes per node
    with servers[0], servers[1]:
        urls = [s.url for s in servers]
        full = torchrun(remote["repo"], tmp_path / "full", 2, urls, "--epochs", "2")
        first = [_row_group_bytes([(p, r) for m, p, r in s.requests if m == "GET"], remote["groups"]) for s in servers]
        cut = torchrun(remote["repo"], tmp_path / "cut", 2, urls, "--epochs", "2", "--max-steps", str(K),
                       "--checkpoint", str(tmp_path / "ckpt.pt"), "--checkpoint-every", "1")
    dataset = sum(end - first for _, first, end in remote["groups"])
    for nbytes, asked in first:
        assert max(asked.values()) == 1  # two epochs, two ranks, one worker each: every row group fetched once
        assert nbytes <= 1.1 * dataset / 2, (nbytes, dataset)  # a node's half, not the whole dataset
    assert set(first[0][1]).isdisjoint(first[1][1]) and len(first[0][1]) + len(first[1][1]) == len(remote["groups"])
    steps, labels = _steps(full), remote["labels"]
    for epoch in (0, 1):
        ids = [i for (e, _), batch in steps.items() if e == epoch for i in batch]
        assert Counter(ids) == Counter(list(labels))  # TOTAL divides the global batch: every image once an epoch
    for r in full:
        assert r["labels"] == [labels[i] for i in r["ids"]] and r["node"] == r["rank"] // 2
    by_step = defaultdict(list)
    for r in full:
        by_step[r["global_step"]].append(set(r["ids"]))
    assert all(len(set.union(*b)) == sum(map(len, b)) for b in by_step.values())  # ranks disjoint in every step
    assert [r["ids"] for r in cut] == [r["ids"] for r in full[: WORLD * K]]
    # resumed on one node of 2 processes (another topology; per-rank batch 16: the same global batch of 32): the
    # rest of epoch 0 in the same global steps
    with RangeServer(remote["store"]) as one:
        rest = torchrun(remote["repo"], tmp_path / "rest", 1, [one.url], "--epochs", "1", "--resume",
                        str(tmp_path / "ckpt.pt"), "--batch-size", str(2 * BATCH))
    again = _steps(rest)
    assert {k: v for k, v in steps.items() if k[0] == 0 and k[1] > K} == again
    seen = Counter(i for r in cut for i in r["ids"]) + Counter(i for r in rest for i in r["ids"])
    assert seen == Counter(list(labels))


def test_two_nodes_from_moto_s3_fetch_the_dataset_about_once(remote, tmp_path):
    import boto3

    port = free_port()
    with CountingMotoServer(port) as s3:
        client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="train")
        for path in sorted(remote["store"].rglob("*")):
            if path.is_file():
                client.upload_file(str(path), "train", f"store/{path.relative_to(remote['store'])}")
        config = remote["repo"] / ".dvc" / "config"
        saved = config.read_text()
        config.write_text(saved + f"['remote \"s3\"']\n    url = s3://train/store\n    endpointurl = {s3.endpoint}\n")
        try:
            before = s3.bytes_served
            records = torchrun(remote["repo"], tmp_path / "s3", 2, ["s3", "s3"], "--epochs", "2", env=S3_ENV)
            served = s3.bytes_served - before
        finally:
            config.write_text(saved)
    shards = sum(p.stat().st_size for p in (remote["repo"] / "data/parquet/train").glob("*.parquet"))
    assert Counter(i for r in records if r["epoch"] == 1 for i in r["ids"]) == Counter(list(remote["labels"]))
    # two nodes, two epochs: each row group once in all (+ each node's footer reads), not once per node and epoch
    assert served <= 1.1 * shards + 2 * 4 * (1 << 19), (served, shards)
