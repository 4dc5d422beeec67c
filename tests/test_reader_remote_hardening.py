"""The remote reader against a remote that lies or misbehaves (issue 21): listings that climb out of the cache,
flipped and shifted range replies, a server that never answers, one that ignores Range, one that wants
credentials, a small cache shared by processes (concurrent eviction, a full disk, one fetch per row group) and
revisions that look like options. Real servers on 127.0.0.1 only (tests/helpers/servers.py, `http.server`)."""
from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset
from imagenet_parquet.dvcremote import RemoteError
from tests.helpers.dvc_remote import TOTAL, build_project, run
from tests.helpers.images import identify
from tests.helpers.project import GIT
from tests.helpers.servers import RangeServer, free_port, stop_process, wait_http

FAST = {"connect_timeout": 1.0, "read_timeout": 1.0, "object_timeout": 6.0, "retries": 2, "retry_backoff": 0.05}
# a healthy server on a busy machine (CI: the suite on 2 cores): the defaults' order of timeouts, short backoff
PATIENT = {"connect_timeout": 10.0, "read_timeout": 30.0, "object_timeout": 60.0, "retries": 3, "retry_backoff": 0.05}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> dict[str, Path]:
    return build_project(tmp_path_factory.mktemp("dvc"))


@pytest.fixture
def server(project):
    with RangeServer(project["remote"]) as srv:
        yield srv


def _local(project) -> ParquetImageDataset:
    return ParquetImageDataset(project["repo"] / "data" / "parquet", "train", decode=False)


def _remote(project, url: str, cache: Path, **kw) -> ParquetImageDataset:
    return ParquetImageDataset.from_dvc(project["node"], "data/parquet/train", remote=url, decode=False,
                                        cache_dir=cache, **{**FAST, **kw})


def _pieces(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("*") if p.is_file() and p.name not in ("footer", "listing", ".usage") and not p.name.endswith(".lock"))


def _shard_paths(project) -> list[str]:
    listing = next(p for p in project["remote"].rglob("*.dir"))
    return [f"/files/md5/{e['md5'][:2]}/{e['md5'][2:]}" for e in json.loads(listing.read_bytes())]


# ---------------------------------------------------------------- 1. names from the listing
def _checkout(root: Path, remote: Path, entries: list[dict[str, str]], lock_md5: str | None = None) -> Path:
    """A checkout (dvc.lock + .dvc/config) whose out is the listing `entries`, written into `remote` under its
    own md5 (or under `lock_md5`, a listing that does not match its name)."""
    listing = json.dumps(entries).encode()
    md5 = lock_md5 or hashlib.md5(listing).hexdigest() + ".dir"
    obj = remote / "files" / "md5" / md5[:2] / md5[2:]
    obj.parent.mkdir(parents=True, exist_ok=True)
    obj.write_bytes(listing)
    checkout = root / "checkout"
    (checkout / ".dvc").mkdir(parents=True, exist_ok=True)
    (checkout / "dvc.lock").write_text(f"schema: '2.0'\nstages:\n  convert:\n    cmd: 'true'\n    outs:\n"
                                       f"    - path: data/parquet\n      hash: md5\n      md5: {md5}\n")
    (checkout / ".dvc" / "config").write_text(f"[core]\n    remote = r\n['remote \"r\"']\n    url = {remote}\n")
    return checkout


def test_listing_names_that_climb_out_of_the_cache_are_refused(project, tmp_path):
    remote = tmp_path / "remote"
    shutil.copytree(project["remote"], remote)
    shard = next(p for p in remote.rglob("*") if p.is_file() and not p.name.endswith(".dir"))
    outside = str(tmp_path / "outside")  # an absolute "md5": the cache would write <outside>/footer
    obj = Path(f"{remote}/files/md5/{outside[:2]}/{outside[2:]}")
    obj.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shard, obj)
    checkout = _checkout(tmp_path, remote, [{"md5": outside, "relpath": "train/a.parquet"}])
    with pytest.raises(RemoteError, match=r"expected 32 hex digits.*found '/"):
        ParquetIterableDataset.from_dvc(checkout, "data/parquet/train", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "outside").exists()
    for bad in ("../../etc", "a" * 31 + "/"):
        checkout = _checkout(tmp_path, remote, [{"md5": bad, "relpath": "train/a.parquet"}])
        with pytest.raises(RemoteError, match="expected 32 hex digits"):
            ParquetIterableDataset.from_dvc(checkout, "data/parquet/train", cache_dir=tmp_path / "cache")


def test_a_listing_that_does_not_match_its_md5_is_refused(project, tmp_path):
    remote = tmp_path / "remote"
    shutil.copytree(project["remote"], remote)
    good = next(e for e in json.loads(next(remote.rglob("*.dir")).read_bytes()))
    checkout = _checkout(tmp_path, remote, [good], lock_md5="0" * 32 + ".dir")
    with pytest.raises(RemoteError, match=r"expected the listing to have md5 0{32} \(dvc\.lock\), found [0-9a-f]{32}"):
        ParquetIterableDataset.from_dvc(checkout, "data/parquet/train", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


# ---------------------------------------------------------------- 2. flipped and shifted bytes
def test_flipped_range_replies_are_refetched_and_never_cached(project, server, tmp_path):
    cache = tmp_path / "cache"
    ds, local = _remote(project, server.url, cache), _local(project)
    for path in _shard_paths(project):
        server.faults[path].extend([("flip",), ("flip",)])  # the first two row-group replies of each shard
    assert [ds[i] for i in range(TOTAL)] == [local[i] for i in range(TOTAL)]
    fresh = _remote(project, server.url, tmp_path / "fresh")
    server.every = ("flip",)  # every reply from now on: no retry helps
    with pytest.raises(RemoteError, match=r"127\.0\.0\.1.*sha256.*after 3 tries"):
        fresh[7]
    assert _pieces(tmp_path / "fresh") == []  # nothing bad, nothing half-written left in the cache
    assert len(list((tmp_path / "fresh").rglob("footer"))) == 2  # that shard's footer refetched on the next start


def test_a_shifted_range_is_a_remote_error_not_a_format_error_and_not_cached(project, server, tmp_path):
    cache = tmp_path / "cache"
    ds = _remote(project, server.url, cache)
    server.every = ("shift", 3)
    with pytest.raises(RemoteError, match="other bytes than asked") as err:
        ds[12]
    assert "convert" not in str(err.value)
    assert _pieces(cache) == []
    server.every = None  # the server mends: the same cache reads the right image
    assert ds[12] == _local(project)[12]


def test_iterable_reader_yields_only_verified_images(project, server, tmp_path):
    for path in _shard_paths(project):
        server.faults[path].extend([("delay", 0), ("flip",)])  # the footer's reply is fine, then one flip
    ds = ParquetIterableDataset.from_dvc(project["node"], "data/parquet/train", remote=server.url,
                                         cache_dir=tmp_path / "c", decode=False, seed=3, **FAST)
    local = ParquetIterableDataset(project["repo"] / "data" / "parquet", "train", decode=False, seed=3)
    assert list(ds) == list(local)


# ---------------------------------------------------------------- 3. a server that never answers
def test_a_server_that_never_answers_fails_within_the_timeouts(project, server, tmp_path):
    ds = _remote(project, server.url, tmp_path / "cache")
    server.every = ("hang",)
    started = time.monotonic()
    with pytest.raises(RemoteError, match=r"http://127\.0\.0\.1:\d+/files/md5/.*(timed out|Timeout)"):
        ds[3]
    assert time.monotonic() - started < FAST["object_timeout"] + 2
    from imagenet_parquet.fetch import Policy

    default = Policy()
    assert default.object_timeout <= 60 and default.connect_timeout < 60 and default.read_timeout < 60


# ---------------------------------------------------------------- 4. credentials
SECRET = "s3cret-Pa55"


def _http_clone(project, tmp_path: Path, url: str, section: str, local: str = "") -> Path:
    node = tmp_path / "node"
    run(["git", "clone", "-q", str(project["repo"]), str(node)], tmp_path)
    config = node / ".dvc" / "config"
    config.write_text(config.read_text() + f"['remote \"web\"']\n    url = {url}\n{section}")
    run([*GIT, "commit", "-qam", "web remote"], node)
    if local:
        (node / ".dvc" / "config.local").write_text(f"['remote \"web\"']\n{local}")
    return node


def test_http_basic_auth_from_the_dvc_config_and_no_secret_anywhere(project, server, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    server.auth = ("basic", "alice", SECRET)
    node = _http_clone(project, tmp_path, server.url, "    auth = basic\n    user = alice\n",
                       f"    password = {SECRET}\n")
    ds = ParquetImageDataset.from_dvc(node, "data/parquet/train", remote="web", decode=False,
                                      cache_dir=tmp_path / "cache", **FAST)
    assert ds[9] == _local(project)[9]
    assert SECRET not in repr(ds.remote.remote) and SECRET not in repr(ds)
    (node / ".dvc" / "config.local").write_text("['remote \"web\"']\n    password = wrong-Pa55\n")
    with pytest.raises(RemoteError, match=r"401.*config\.local") as err:
        ParquetImageDataset.from_dvc(node, "data/parquet/train", remote="web", cache_dir=tmp_path / "c2", **FAST)
    assert "wrong-Pa55" not in str(err.value)
    in_url = server.url.replace("://", f"://alice:{SECRET}@")
    ds = ParquetImageDataset.from_dvc(project["node"], "data/parquet/train", remote=in_url, decode=False,
                                      cache_dir=tmp_path / "cache", **FAST)
    assert ds[30] == _local(project)[30]
    server.every = ("status", 500)
    with pytest.raises(RemoteError, match=r"alice:\*\*\*@127\.0\.0\.1") as err:
        ds[50]
    assert SECRET not in str(err.value) and SECRET not in repr(ds.remote.remote) and SECRET not in caplog.text
    assert not any(SECRET.encode() in p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()
                   and ".git" not in p.parts and p.name != "config.local")


def test_custom_auth_header_with_the_token_from_the_environment(project, server, tmp_path, monkeypatch):
    server.auth = ("header", "X-Token", SECRET)
    node = _http_clone(project, tmp_path, server.url, "    auth = custom\n    custom_auth_header = X-Token\n")
    monkeypatch.setenv("IMAGENET_PARQUET_HTTP_PASSWORD", SECRET)
    ds = ParquetImageDataset.from_dvc(node, "data/parquet/train", remote="web", decode=False,
                                      cache_dir=tmp_path / "cache", **FAST)
    assert ds[41] == _local(project)[41]
    assert SECRET not in repr(ds.remote.remote) and SECRET not in repr(pickle.loads(pickle.dumps(ds.remote)).remote)


# ---------------------------------------------------------------- 5. a server that ignores Range
def test_a_server_that_ignores_range_gets_a_precise_error(project, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port), "--directory",
                             str(project["remote"])], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/", timeout=30)
        with pytest.raises(RemoteError, match=r"127\.0\.0\.1.*ignores Range.*200") as err:
            ds = _remote(project, f"http://127.0.0.1:{port}", tmp_path / "cache")
            ds[22]
        assert "shorter" not in str(err.value) and "dvc push" not in str(err.value)
    finally:
        stop_process(proc)
    assert _pieces(tmp_path / "cache") == []


# ---------------------------------------------------------------- 6. a small cache shared by processes
def _hammer(project, url: str, cache: Path, one_group: float, seed: int, out) -> None:
    import random

    ds = _remote(project, url, cache, cache_gb=one_group / 1e9, **PATIENT)
    local, rng, bad = _local(project), random.Random(seed), []
    try:
        for i in (rng.randrange(TOTAL) for _ in range(60)):
            if ds[i] != local[i]:
                bad.append(i)
        out.put(("ok", bad))
    except Exception as err:  # reported to the parent, which fails the test
        out.put(("error", f"{type(err).__name__}: {err}"))


def test_small_cache_shared_by_processes_survives_concurrent_eviction(project, server, tmp_path):
    cache = tmp_path / "cache"
    one_group = max(os.path.getsize(p) for p in (project["repo"] / "data/parquet/train").glob("*.parquet")) / 4
    _remote(project, server.url, cache)  # footers cached
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(project, server.url, cache, one_group, s, out)) for s in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert results == [("ok", [])] * 4
    assert not list(cache.rglob("*.tmp"))


def _read_one(shards, barrier, out) -> None:
    barrier.wait(30)
    out.put(shards.read_image(1, 2, 11))


def test_a_row_group_wanted_by_several_processes_is_fetched_once(project, server, tmp_path):
    ds = _remote(project, server.url, tmp_path / "cache")
    server.requests.clear()
    server.every = ("delay", 0.5)
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_read_one, args=(ds.remote, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    images = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert len(set(images)) == 1 and images[0] == _local(project)[20 + 11][0]
    assert len([r for r in server.requests if r[0] == "GET" and r[2]]) == 1


FULL_DISK = textwrap.dedent("""
    import os, subprocess, sys
    cache = sys.argv[1]
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={sys.argv[4]}", "tmpfs", cache], check=True)
    from imagenet_parquet import ParquetImageDataset
    from imagenet_parquet.dvcremote import RemoteError
    ds = ParquetImageDataset.from_dvc(sys.argv[2], "data/parquet/train", remote=sys.argv[3], decode=False,
                                      cache_dir=cache)
    try:
        [ds[i] for i in range(0, 60, 5)]
        print("no error")
    except RemoteError as err:
        print("RemoteError:", err)
    print("left:", sorted(n for _, _, names in os.walk(cache) for n in names if n.endswith(".tmp")))
""")


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs user namespaces (unshare -rm: a private tmpfs, a real full disk)")
def test_a_full_cache_disk_is_one_clear_error_and_leaves_no_temp_file(project, server, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    footers = sum(p.stat().st_size for p in (project["repo"] / "data/parquet/train").glob("*.parquet"))
    out = subprocess.run(["unshare", "-rm", sys.executable, "-c", FULL_DISK, str(cache), str(project["node"]),
                          server.url, str(footers)], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parents[1], env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"RemoteError: {cache}: no space left" in out.stdout and "cache_gb" in out.stdout, out.stdout
    assert "left: []" in out.stdout, out.stdout


def _counted_write(cache: Path, path: Path, size: int) -> None:
    """Write `size` bytes at `path` as a reader does: counted in the cache's ledger first (cache.py)."""
    ledger = cache / ".usage"
    ledger.write_text(str(int(ledger.read_text()) + size))
    path.write_bytes(b"x" * size)


def test_orphan_temp_files_are_counted_and_cleaned(project, server, tmp_path):
    cache = tmp_path / "cache"
    ds = _remote(project, server.url, cache, cache_gb=1e-3)
    shard = next(p for p in cache.iterdir() if p.is_dir())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = shard / f".3.{dead.stdout.strip()}.1.tmp"  # a worker killed mid-write (its bytes counted first)
    _counted_write(cache, orphan, 4_000_000)
    ds[0]
    assert not orphan.exists()
    live = shard / f".4.{os.getpid()}.1.tmp"  # another worker writing right now: counted, kept
    _counted_write(cache, live, 2_000_000)
    ds[30], ds[45]
    assert live.exists() and len([p for p in cache.rglob("*") if p.name.isdigit()]) == 1  # only the newest piece


# ---------------------------------------------------------------- 7. revisions
def test_a_revision_that_looks_like_an_option_is_refused(project, tmp_path):
    target = tmp_path / "x"
    with pytest.raises(RemoteError, match=r"rev: expected a git revision.*found '--output="):
        ParquetIterableDataset.from_dvc(project["node"], "data/parquet/train", rev=f"--output={target}",
                                        cache_dir=tmp_path / "cache")
    assert not list(tmp_path.glob("x*"))
    ds = ParquetIterableDataset.from_dvc(project["node"], "data/parquet/train", rev="HEAD", cache_dir=tmp_path / "c")
    assert len(ds) == TOTAL
