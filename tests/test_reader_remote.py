"""Training straight from a DVC remote (no `dvc pull`): a real DVC project (`dvc init`, a stage's out committed
to dvc.lock, `dvc push` to a directory remote) and a `git clone` of it that never pulls; the clone's reader
resolves the shards from dvc.lock + the remote's `.dir` object and reads them by range requests from that
directory served over HTTP on 127.0.0.1 and from moto's S3 server, caching row groups locally within a bound."""
from __future__ import annotations

import os
import re
from pathlib import Path

import boto3
import pytest
from torch.utils.data import DataLoader

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset
from imagenet_parquet.dvcremote import RemoteError
from tests.helpers.dvc_remote import TOTAL, build_project, run
from tests.helpers.images import identify
from tests.helpers.project import GIT
from tests.helpers.range_files import serving
from tests.helpers.servers import free_port

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> dict[str, Path]:
    return build_project(tmp_path_factory.mktemp("dvc"))


@pytest.fixture
def http_remote(project):
    with serving(project["remote"]) as (url, log):
        yield url, log


def _local(project, split="train", **kw) -> ParquetIterableDataset:
    return ParquetIterableDataset(project["repo"] / "data" / "parquet", split, transform=identify, **kw)


def _epoch(ds, workers: int = 2) -> list[tuple[int, int]]:
    loader = DataLoader(ds, batch_size=4, num_workers=workers, multiprocessing_context="fork")
    return [(int(i), int(y)) for ids, labels in loader for i, y in zip(ids, labels)]


def test_clone_trains_from_http_remote_in_the_elastic_order(project, http_remote, tmp_path):
    url, log = http_remote
    runs, fetched = [], []
    for rank in (0, 1):  # two nodes: their own caches
        ds = ParquetIterableDataset.from_dvc(project["node"], "data/parquet/train", remote=url, transform=identify,
                                             cache_dir=tmp_path / f"cache{rank}", rank=rank, world_size=2, seed=4)
        assert len(ds.files) == 3 and len(ds) == TOTAL // 2
        log.clear()
        runs.append(_epoch(ds))
        fetched.append([r for p, r in log if r and not p.endswith(".dir")])
        assert runs[-1] == _epoch(_local(project, rank=rank, world_size=2, seed=4))  # same order as local
    assert sorted(i for run in runs for i, _ in run) == list(range(TOTAL))
    groups = TOTAL // 5
    # the elastic order interleaves ranks over every row group of a window: each node fetches every row group
    assert all(len(f) == len(set(f)) == groups for f in fetched)  # once per node: its workers share the cache
    assert all(re.fullmatch(r"bytes=\d+-\d+", r) for f in fetched for r in f)
    log.clear()
    again = ParquetIterableDataset.from_dvc(project["node"], "data/parquet/train", remote=url, transform=identify,
                                            cache_dir=tmp_path / "cache0", rank=0, world_size=2, seed=4)
    assert _epoch(again) == runs[0]
    assert [p for p, _ in log if not p.endswith(".dir")] == []  # footers and row groups from the cache


def test_cache_stays_within_its_bound_and_map_style_reads_through_it(project, http_remote, tmp_path,
                                                                     monkeypatch):
    url, _ = http_remote
    cache = tmp_path / "cache"
    one_group = max(os.path.getsize(p) for p in (project["repo"] / "data/parquet/train").glob("*.parquet")) / 4
    ds = ParquetImageDataset.from_dvc(project["node"], "data/parquet/train", remote=url, decode=False,
                                      cache_dir=cache, cache_gb=3 * one_group / 1e9)
    local = ParquetImageDataset(project["repo"] / "data" / "parquet", "train", decode=False)
    for i in [5, 59, 0, 33, 17, 42, 8, 51]:
        assert ds[i] == local[i]
        used = sum(p.stat().st_blocks * 512 for p in cache.rglob("*") if p.is_file() and p.name.isdigit())
        assert used <= 3 * one_group + one_group, used
    assert list(ds.targets) == list(local.targets)
    monkeypatch.setattr("imagenet_parquet.remote.decode_image_index", lambda *a: None)  # shards without the index
    fallback = ParquetImageDataset.from_dvc(project["node"], "data/parquet/train", remote=url, decode=False,
                                            cache_dir=cache, cache_gb=1)
    assert [fallback[i] for i in (7, 44, 0)] == [local[i] for i in (7, 44, 0)]  # row groups through the cache


def test_s3_remote_from_dvc_config_with_credentials_from_the_environment(project, tmp_path, monkeypatch):
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        s3 = boto3.client("s3", endpoint_url=endpoint, **{k.lower(): v for k, v in S3_ENV.items() if "KEY" in k},
                          region_name="us-east-1")
        s3.create_bucket(Bucket="training-data")
        for path in sorted(project["remote"].rglob("*")):
            if path.is_file():
                s3.upload_file(str(path), "training-data", f"imagenet/{path.relative_to(project['remote'])}")
        node = tmp_path / "node"
        run(["git", "clone", "-q", str(project["repo"]), str(node)], tmp_path)
        config = node / ".dvc" / "config"
        config.write_text(config.read_text() + "['remote \"s3\"']\n    url = s3://training-data/imagenet\n"
                          f"    endpointurl = {endpoint}\n")
        run([*GIT, "commit", "-qam", "s3 remote"], node)
        for key, value in S3_ENV.items():
            monkeypatch.setenv(key, value)
        ds = ParquetIterableDataset.from_dvc(node, "data/parquet", remote="s3", split="val", transform=identify,
                                             shuffle=False, cache_dir=tmp_path / "c")
        assert [i for i, _ in ds] == list(range(9))
        train = ParquetIterableDataset.from_dvc(node, "data/parquet/train", rev="HEAD", remote="s3",
                                                transform=identify, cache_dir=tmp_path / "c", seed=4)
        assert sorted(i for i, _ in train) == list(range(TOTAL))
    finally:
        server.stop()


def test_default_remote_directory_and_errors_that_name_what_is_missing(project, http_remote, tmp_path):
    url, _ = http_remote
    ds = ParquetIterableDataset.from_dvc(project["node"], "data/parquet/val", cache_dir=tmp_path, shuffle=False,
                                         transform=identify)  # core.remote: the directory `dvc push` filled
    assert ds.remote.remote.url == str(project["remote"]) and [i for i, _ in ds] == list(range(9))
    with pytest.raises(RemoteError, match=r"expected an out holding 'data/other'.*data/parquet"):
        ParquetIterableDataset.from_dvc(project["node"], "data/other", remote=url, cache_dir=tmp_path)
    with pytest.raises(RemoteError, match="run `dvc push`"):
        ParquetIterableDataset.from_dvc(project["node"], "data/parquet/train", remote=url + "/nothing",
                                        cache_dir=tmp_path)
    with pytest.raises(RemoteError, match=r"expected remote nope with a url, found remotes \['store'\]"):
        ParquetIterableDataset.from_dvc(project["node"], "data/parquet/train", remote="nope", cache_dir=tmp_path)
