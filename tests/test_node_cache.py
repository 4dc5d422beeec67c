"""One cache per node (issue 47), against a real Range server on 127.0.0.1 that counts the bytes it sends: the ranks
of a node (concurrent processes) fetch each row group of their partitions once, nodes split the row groups, epoch 2
comes from the cache, a cache at its limit stays within it at every moment and the epoch completes, a process
killed mid-fetch leaves nothing that is served afterwards, and a changed cached byte is refused and fetched again."""
from __future__ import annotations

import fcntl
import io
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset
from imagenet_parquet.cache import Cache, EvictionPlan, parse_size
from imagenet_parquet.shards import row_group_span
from tests.helpers.dvc_remote import TOTAL, build_project
from tests.helpers.images import identify
from tests.helpers.servers import RangeServer

C = 4  # canonical partitions: 15 of the 60 rows (3 row groups of 5) each
FORK = multiprocessing.get_context("fork")
POLICY = {"connect_timeout": 10.0, "read_timeout": 30.0, "object_timeout": 60.0, "retries": 3, "retry_backoff": 0.05}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> dict[str, Path]:
    return build_project(tmp_path_factory.mktemp("dvc"))


@pytest.fixture
def server(project):
    with RangeServer(project["remote"]) as srv:
        yield srv


def _spans(project) -> dict[tuple[str, int, int], int]:
    """(object path, first, end) of every train row group -> its unit (global row group index)."""
    import json

    listing = json.loads(next(project["remote"].rglob("*.dir")).read_bytes())
    md5 = {Path(e["relpath"]).name: e["md5"] for e in listing}
    spans, unit = {}, 0
    for path in sorted((project["repo"] / "data/parquet/train").glob("*.parquet")):
        meta = pq.read_metadata(path)
        for g in range(meta.num_row_groups):
            first, end = row_group_span(meta, g)
            spans[(f"/files/md5/{md5[path.name][:2]}/{md5[path.name][2:]}", first, end)] = unit
            unit += 1
    return spans


def _fetched_units(server: RangeServer, spans, since: int) -> list[int]:
    """The row groups requested since request `since` (in order; a footer or listing request is not one)."""
    out = []
    for _, path, rng in server.requests[since:]:
        if rng:
            first, last = (int(x) for x in rng.removeprefix("bytes=").split("-"))
            if (path, first, last + 1) in spans:
                out.append(spans[(path, first, last + 1)])
    return out


def _dataset(project, url: str, cache: Path, rank: int, world: int, per: int, **kw) -> ParquetIterableDataset:
    return ParquetIterableDataset.from_dvc(
        project["node"], "data/parquet/train", remote=url, cache_dir=cache, decode=False, seed=2, rank=rank,
        world_size=world, ranks_per_node=per, batch_size=3, **{"canonical_nodes": C, **POLICY, **kw})


def _rank_ids(project, url, cache, rank, world, per, out, epoch=0, **kw) -> None:
    ds = _dataset(project, url, cache, rank, world, per, **kw)
    ds.set_epoch(epoch)
    out.put((rank, [identify(Image.open(io.BytesIO(data))) for data, _ in ds]))


def _node_epoch(project, url: str, cache: Path, node: int, nodes: int, per: int, **kw) -> dict[int, list[int]]:
    """The ranks of one node as concurrent processes sharing `cache`: {rank: the image ids it yielded}."""
    out = FORK.Queue()
    ranks = range(node * per, (node + 1) * per)
    procs = [FORK.Process(target=_rank_ids, args=(project, url, cache, r, nodes * per, per, out), kwargs=kw)
             for r in ranks]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in ranks)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return got


def test_ranks_of_a_node_share_its_cache_nodes_split_the_row_groups_and_epoch_2_is_local(project, server, tmp_path):
    spans, nodes, per = _spans(project), 2, 2
    seen, groups = [], []
    for node in range(nodes):
        cache, before = tmp_path / f"node{node}", len(server.requests)
        ids = _node_epoch(project, server.url, cache, node, nodes, per)
        seen += [i for r in ids.values() for i in r]
        fetched = _fetched_units(server, spans, before)
        assert len(fetched) == len(set(fetched)), fetched  # one fetch per row group, for both ranks of the node
        assert {i // 5 for r in ids.values() for i in r} == set(fetched)  # the row groups its rows are in, only
        groups.append(set(fetched))
        served = server.bytes_served
        again = _node_epoch(project, server.url, cache, node, nodes, per, epoch=1)  # another order, same groups
        assert server.bytes_served == served  # epoch 2: footers and row groups all from the node's cache
        assert sorted(i for r in again.values() for i in r) == sorted(i for r in ids.values() for i in r)
    assert sorted(seen) == list(range(TOTAL))
    assert groups[0].isdisjoint(groups[1]) and len(groups[0]) == len(groups[1]) == 6  # partitions of 3 groups


def _range_bytes(server: RangeServer, since: int, sizes: dict[str, int]) -> int:
    """Bytes of the range requests since request `since`, footer reads (a shard's tail) left out."""
    total = 0
    for _, path, rng in server.requests[since:]:
        if rng and path in sizes:
            first, last = (int(x) for x in rng.removeprefix("bytes=").split("-"))
            total += 0 if last + 1 == sizes[path] else last + 1 - first
    return total


def test_row_groups_cut_by_a_partition_bound_are_fetched_as_each_nodes_rows_only(project, server, tmp_path):
    spans = _spans(project)
    sizes = {path: max(end for p, _, end in spans if p == path) for path, _, _ in spans}
    sizes = {path: (project["remote"] / path.lstrip("/")).stat().st_size for path in sizes}
    groups = sum(end - first for _, first, end in spans)
    fetched, seen = 0, []
    for node in range(2):  # 8 partitions of 7-8 rows over 5-row groups: most groups are cut between two nodes
        before = len(server.requests)
        ids = _node_epoch(project, server.url, tmp_path / f"n{node}", node, 2, 1, canonical_nodes=8)
        fetched += _range_bytes(server, before, sizes)
        seen += [i for r in ids.values() for i in r]
    assert sorted(seen) == list(range(TOTAL))
    assert fetched <= 1.15 * groups, (fetched, groups)  # whole groups by both nodes would be ~2x


def test_a_cache_at_its_limit_stays_within_it_at_every_moment_and_the_epoch_completes(project, server, tmp_path):
    share = sum(end - first for (_, first, end) in _spans(project)) / 2
    footers = sum(os.path.getsize(p) for p in (project["repo"] / "data/parquet/train").glob("*.parquet")) // 4
    limit = int(0.3 * share) + footers  # 30 % of a node's share of the row groups, plus the footers it keeps
    cache, peak, done = tmp_path / "small", [0], threading.Event()

    def watch() -> None:
        probe = Cache(cache, limit)
        while not done.is_set():
            peak[0] = max(peak[0], probe.usage())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    before = len(server.requests)
    try:
        ids = _node_epoch(project, server.url, cache, 0, 2, 2, cache_limit=limit, predownload=2)
    finally:
        done.set()
        watcher.join()
    assert 0 < peak[0] <= limit, (peak[0], limit)
    assert Cache(cache, limit).usage() <= limit
    sizes = {path: (project["remote"] / path.lstrip("/")).stat().st_size for path, _, _ in _spans(project)}
    chunks = 0  # the small sha256 and label chunks of every row group
    for path in (project["repo"] / "data/parquet/train").glob("*.parquet"):
        meta = pq.read_metadata(path)
        for g in range(meta.num_row_groups):
            chunks += sum(meta.row_group(g).column(c).total_compressed_size for c in range(meta.num_columns)
                          if meta.row_group(g).column(c).path_in_schema in ("sha256", "label"))
    # its live row groups do not fit: rows are fetched alone, each once (not a row group per image), and a
    # group's small chunks once per process
    fetched = _range_bytes(server, before, sizes)
    assert fetched <= 1.1 * share + 2 * chunks, (fetched, share, chunks)
    full = _node_epoch(project, server.url, tmp_path / "large", 0, 2, 2)
    assert ids == full  # every image of the node's share, in the same order


def test_a_process_killed_mid_fetch_leaves_nothing_that_is_served(project, server, tmp_path):
    cache = tmp_path / "cache"
    ds = ParquetImageDataset.from_dvc(project["node"], "data/parquet/train", remote=server.url, decode=False,
                                      cache_dir=cache, **POLICY)  # footers cached now
    local = ParquetImageDataset(project["repo"] / "data/parquet", "train", decode=False)
    path = next(p for (p, _, _) in _spans(project))
    server.faults[path].append(("stall", 8))  # the next row-group request sends 1 KiB, then goes quiet
    child = FORK.Process(target=lambda: ds[0])
    child.start()
    deadline = time.monotonic() + 20
    while not any(p.name.endswith(".tmp") for p in cache.rglob("*")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert any(p.name.endswith(".tmp") for p in cache.rglob("*")), "the child never started its fill"
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert not (cache / path.split("/")[-2] / "0").exists()  # no piece under its final name
    assert ds[0] == local[0] and ds[1] == local[1]  # fetched again whole, checked


def test_a_changed_cached_byte_is_refused_and_fetched_again(project, server, tmp_path):
    cache = tmp_path / "cache"
    ds = ParquetImageDataset.from_dvc(project["node"], "data/parquet/train", remote=server.url, decode=False,
                                      cache_dir=cache, **POLICY)
    local = ParquetImageDataset(project["repo"] / "data/parquet", "train", decode=False)
    assert ds[2] == local[2]
    spans = _spans(project)
    obj = next(p for (p, _, _) in spans).split("/")[-2:]
    piece = cache / "".join(obj) / "0"
    from imagenet_parquet.format import decode_image_index

    meta = pq.read_metadata(local.files[0])
    offset, size = decode_image_index(meta.metadata, meta.num_rows, "x")[2]
    for where in (offset + size // 2, offset - 2):  # a byte of the image, then of its length prefix
        data = bytearray(piece.read_bytes())
        data[where] ^= 0x5A
        piece.write_bytes(bytes(data))
        before = len(server.requests)
        assert ds[2] == local[2]  # refused, the piece deleted and fetched again
        assert len(_fetched_units(server, spans, before)) == 1
    rows = pq.ParquetFile(local.files[0]).metadata.row_group(0)
    sha = next(rows.column(c) for c in range(rows.num_columns) if rows.column(c).path_in_schema == "sha256")
    fresh = ParquetImageDataset.from_dvc(project["node"], "data/parquet/train", remote=server.url, decode=False,
                                         cache_dir=cache, **POLICY)  # a new process's view: hashes not parsed yet
    data = bytearray(piece.read_bytes())
    data[sha.data_page_offset + sha.total_compressed_size // 2] ^= 0x5A  # the sha256 chunk itself
    piece.write_bytes(bytes(data))
    before = len(server.requests)
    assert fresh[1] == local[1] and len(_fetched_units(server, spans, before)) == 1


def test_predownload_fetches_the_next_row_groups_ahead_of_the_reads(project, server, tmp_path):
    ds = _dataset(project, server.url, tmp_path / "cache", 0, 1, 1, predownload=3)
    spans = _spans(project)
    before = len(server.requests)
    first = next(iter(ds))  # one image read; the thread fetches three row groups past its own
    assert first
    deadline = time.monotonic() + 20
    while len(_fetched_units(server, spans, before)) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_fetched_units(server, spans, before)) >= 4


def test_eviction_follows_the_nodes_plan_and_sizes_parse():
    plan = EvictionPlan.of_reads(["a" * 32, "b" * 32], np.array([0, 3]), np.array([0, 1, 3, 1, 4, 2]), 5)
    assert plan.first.tolist() == [0, 1, 5, 2, 4] and plan.last.tolist() == [0, 3, 5, 2, 4]
    plan.cursor = 3
    keys = {name: plan.key(obj, name, mtime=1.0) for obj, name in
            (("a" * 32, "0"), ("a" * 32, "1"), ("a" * 32, "2"), ("b" * 32, "0"), ("b" * 32, "1"), ("c" * 32, "0"))}
    ranked = sorted(keys, key=keys.get)
    assert ranked[0] == "0" and keys["0"][0] in (0, 1)  # another version's, or done with: evicted first
    assert plan.key("c" * 32, "0", 1.0) < plan.key("a" * 32, "0", 1.0) < plan.key("a" * 32, "2", 1.0)
    assert plan.key("a" * 32, "2", 1.0) < plan.key("a" * 32, "1", 1.0)  # read at 5, after the one read at 3
    assert parse_size("200GB") == 200 * 10**9 and parse_size("1.5 TB") == 15 * 10**11
    assert parse_size("500MiB") == 500 * 2**20 and parse_size(4096) == 4096
    for bad in ("", "lots", "-1GB", "10XB", 0, True):
        with pytest.raises(ValueError, match="cache_limit: expected a size"):
            parse_size(bad)


def test_a_lock_held_by_a_thread_at_a_fork_is_not_held_by_the_child_and_a_lock_never_let_go_is_one_error(tmp_path):
    """A DataLoader worker forked while another thread of its parent fills a piece (or evicts) must not keep that
    lock taken for its whole life; a lock another process never lets go of ends in one RemoteError, not a hang."""
    from imagenet_parquet import cache as cache_mod
    from imagenet_parquet.dvcconfig import RemoteError

    lock, taken, release = tmp_path / "x.lock", threading.Event(), threading.Event()
    Cache(tmp_path, 1 << 20)._evicting.acquire()  # a cache whose eviction mutex is held at the fork

    def hold() -> None:
        with cache_mod._locked(lock):
            taken.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert taken.wait(10)
    reader, writer = FORK.Pipe(duplex=False)

    def child() -> None:  # after the parent's thread lets go, the child can take the lock and every cache's mutex
        time.sleep(0.5)
        try:
            with cache_mod._locked(lock, wait=10):
                mutexes = [c._evicting.acquire(timeout=5) for c in list(cache_mod._CACHES)]
            writer.send(all(mutexes))
        except Exception as err:
            writer.send(repr(err))

    process = FORK.Process(target=child)
    process.start()
    release.set()
    holder.join(10)
    assert reader.poll(30) and reader.recv() is True
    process.join(10)
    fd = os.open(lock, os.O_RDWR)  # another open file description: another holder, as another process would be
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(RemoteError, match=r"x\.lock: still locked after 0\.5 s"), cache_mod._locked(lock, 0.5):
            pass
    finally:
        os.close(fd)
