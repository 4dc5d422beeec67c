"""A dataset read from an HTTP remote with credentials pickles without them (not the password, not
its base64 in a Basic header, not a custom header's value; nor in repr), and a copy — a spawned DataLoader worker —
re-reads them from where they came from: .dvc/config.local, the environment (IMAGENET_PARQUET_HTTP_USER /
IMAGENET_PARQUET_HTTP_PASSWORD), or, in a forked process, the remote= URL's user:password@. A copy that cannot
find them fails at its first request with one RemoteError that says where it looked and what to do."""
from __future__ import annotations

import base64
import pickle
import shutil
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, dvcconfig
from imagenet_parquet.dvcremote import RemoteError
from tests.helpers.http_remote import TOTAL, RecordingServer, add_remote, build_checkout
from tests.helpers.images import identify

SECRET = "Pickle-s3cret-i28"
FAST = {"connect_timeout": 2.0, "read_timeout": 10.0, "object_timeout": 30.0, "retries": 1, "retry_backoff": 0.05}
KINDS = {  # kind: (server's check, .dvc/config lines, .dvc/config.local lines, environment)
    "basic": (("basic", "alice", SECRET), "    auth = basic\n    user = alice\n", f"    password = {SECRET}\n", {}),
    "custom": (("header", "X-Token", SECRET), "    auth = custom\n    custom_auth_header = X-Token\n",
               f"    password = {SECRET}\n", {}),
    "env": (("basic", "alice", SECRET), "    auth = basic\n", "",
            {"IMAGENET_PARQUET_HTTP_USER": "alice", "IMAGENET_PARQUET_HTTP_PASSWORD": SECRET}),
    "config-url": (("basic", "alice", SECRET), "", "", {}),  # user:password@ in the URL in .dvc/config
    "url": (("basic", "alice", SECRET), "", "", {}),  # ... in the URL passed as remote=
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return build_checkout(tmp_path_factory.mktemp("pickle"))


@pytest.fixture
def server(data):
    with RecordingServer(data["remote"]) as srv:
        yield srv


def _open(data, tmp_path: Path, server, kind: str, monkeypatch, cls=ParquetImageDataset, decode=False, **kw):
    check, section, local, env = KINDS[kind]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    server.auth = check
    node, url = tmp_path / "node", server.url.replace("://", f"://alice:{SECRET}@")
    shutil.copytree(data["checkout"], node)
    add_remote(node, "web", url if kind == "config-url" else server.url, section, local)
    return node, cls.from_dvc(node, "data/parquet/train", remote=url if kind == "url" else "web", decode=decode,
                              cache_dir=tmp_path / "cache", **FAST, **kw)


def _no_secret(blob: bytes) -> None:
    for form in (SECRET, base64.b64encode(f"alice:{SECRET}".encode()).decode(), base64.b64encode(SECRET.encode())
                 .decode(), SECRET.encode("utf-16-le").decode("latin-1")):
        assert form.encode("latin-1") not in blob, form


@pytest.mark.parametrize("cls", [ParquetImageDataset, ParquetIterableDataset], ids=lambda c: c.__name__)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_pickled_dataset_holds_no_secret_and_its_copy_still_reads(data, server, tmp_path, monkeypatch, kind, cls):
    _, ds = _open(data, tmp_path, server, kind, monkeypatch, cls)
    local = cls(data["local"], "train", decode=False)
    blob = pickle.dumps(ds)
    _no_secret(blob)
    _no_secret(pickle.dumps(ds.remote.remote))
    assert SECRET not in repr(ds) and SECRET not in repr(ds.remote.remote) and SECRET not in repr(ds.remote.fetcher)
    (tmp_path / "cache").rename(tmp_path / "old-cache")  # the copy must fetch again: every request authorised
    copy = pickle.loads(blob)
    if cls is ParquetImageDataset:
        assert [copy[i] for i in range(TOTAL)] == [local[i] for i in range(TOTAL)]
    else:
        assert list(copy) == list(local)
    _no_secret(pickle.dumps(copy))  # a copy that re-read its credentials pickles without them again
    again = pickle.loads(pickle.dumps(copy)).remote.remote
    again.credentials()
    assert again == ds.remote.remote  # the same remote, credentials and all


def test_spawned_dataloader_workers_reread_the_credentials(data, server, tmp_path, monkeypatch, kind="basic"):
    """One spawn (each worker imports torch: seconds); the other sources are re-read in-process above."""
    _, ds = _open(data, tmp_path, server, kind, monkeypatch, ParquetIterableDataset, True, transform=identify,
                  batch_size=5)
    (tmp_path / "cache").rename(tmp_path / "old-cache")  # the workers fetch the row groups themselves
    loader = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context="spawn")
    ids = sorted(int(i) for batch, _ in loader for i in batch)
    assert ids == list(range(TOTAL))
    assert any(h.get("Range") for _, _, h in server.seen)


def test_a_url_password_reaches_forked_copies_only_and_else_fails_clearly(data, server, tmp_path, monkeypatch):
    _, ds = _open(data, tmp_path, server, "url", monkeypatch)
    blob = pickle.dumps(ds)
    (tmp_path / "cache").rename(tmp_path / "old-cache")
    monkeypatch.setattr(dvcconfig, "_URL_SECRETS", {})  # a spawned process: nothing of the parent's memory
    with pytest.raises(RemoteError) as err:
        pickle.loads(blob)[3]
    message = str(err.value)
    assert SECRET not in message and "alice:***@127.0.0.1" in message and "never pickled" in message
    assert "forked processes only" in message
    assert "config.local" in message and "IMAGENET_PARQUET_HTTP_PASSWORD" in message and "\n" not in message
    monkeypatch.setenv("IMAGENET_PARQUET_HTTP_PASSWORD", SECRET)  # ... or the environment
    assert pickle.loads(blob)[3] == ParquetImageDataset(data["local"], "train", decode=False)[3]


def test_a_copy_whose_source_lost_the_password_fails_clearly(data, server, tmp_path, monkeypatch):
    node, ds = _open(data, tmp_path, server, "basic", monkeypatch)
    blob = pickle.dumps(ds)
    (tmp_path / "cache").rename(tmp_path / "old-cache")
    (node / ".dvc" / "config.local").unlink()
    with pytest.raises(RemoteError) as err:
        pickle.loads(blob)[3]
    message = str(err.value)
    assert SECRET not in message and "never pickled" in message
    assert f"{node.resolve()}/.dvc/config" in message and "expected `user` and `password`" in message
    assert "\n" not in message


def test_s3_secrets_from_the_dvc_config_are_not_pickled_either(tmp_path):
    node = tmp_path / "node"
    (node / ".dvc").mkdir(parents=True)
    (node / ".dvc" / "config").write_text("[core]\n    remote = s3\n['remote \"s3\"']\n    url = s3://bucket/store\n"
                                          "    endpointurl = http://127.0.0.1:9\n")
    (node / ".dvc" / "config.local").write_text(f"['remote \"s3\"']\n    access_key_id = AKIAI28\n"
                                                f"    secret_access_key = {SECRET}\n    session_token = tok-{SECRET}\n")
    remote = dvcconfig.find_remote(node, None, None)
    blob = pickle.dumps(remote)
    _no_secret(blob)
    assert SECRET not in repr(remote)
    copy = pickle.loads(blob)
    assert copy.credentials()["secret"] == SECRET and copy.credentials()["token"] == f"tok-{SECRET}"
    assert copy == remote and copy.options["endpoint_url"] == "http://127.0.0.1:9"
