"""The remote's credentials (Basic, DVC's custom auth header, a URL's user:password@) go only to
the origin (scheme, host, port) they were configured for. A remote that redirects (301/302/307/308) to another
port, or from 127.0.0.1 to localhost, gets its objects read from there without them; a redirect inside the same
origin keeps them. Two real servers on 127.0.0.1 (tests/helpers/http_remote.py) record every request's headers."""
from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest

from imagenet_parquet import ParquetImageDataset
from tests.helpers.http_remote import MOVED, TOTAL, RecordingServer, add_remote, build_checkout

SECRET = "s3cret-Pa55-i28"
FAST = {"connect_timeout": 2.0, "read_timeout": 5.0, "object_timeout": 20.0, "retries": 1, "retry_backoff": 0.05}
AUTHS = {  # kind: (server's check, .dvc/config lines, .dvc/config.local lines)
    "basic": (("basic", "alice", SECRET), "    auth = basic\n    user = alice\n", f"    password = {SECRET}\n"),
    "custom": (("header", "X-Token", SECRET), "    auth = custom\n    custom_auth_header = X-Token\n",
               f"    password = {SECRET}\n"),
    "url": (("basic", "alice", SECRET), "", ""),  # user:password@ inside the remote URL
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return build_checkout(tmp_path_factory.mktemp("auth"))


@pytest.fixture
def servers(data):
    with RecordingServer(data["remote"]) as a, RecordingServer(data["remote"]) as b:
        yield a, b


def _dataset(data, tmp_path: Path, server: RecordingServer, kind: str) -> ParquetImageDataset:
    check, section, local = AUTHS[kind]
    server.auth = check
    node = tmp_path / "node"
    shutil.copytree(data["checkout"], node)
    url = server.url.replace("://", f"://alice:{SECRET}@") if kind == "url" else server.url
    add_remote(node, "web", url, section, local)
    return ParquetImageDataset.from_dvc(node, "data/parquet/train", remote="web", decode=False,
                                        cache_dir=tmp_path / "cache", **FAST)


def _credentialed(headers: dict[str, str]) -> bool:
    token = base64.b64encode(f"alice:{SECRET}".encode()).decode()
    lowered = {k.lower(): v for k, v in headers.items()}
    return ("authorization" in lowered or "x-token" in lowered
            or any(SECRET in v or token in v for v in headers.values()))


def _read_all(ds: ParquetImageDataset, data) -> None:
    local = ParquetImageDataset(data["local"], "train", decode=False)
    assert [ds[i] for i in range(TOTAL)] == [local[i] for i in range(TOTAL)]
    assert list(ds.targets) == list(local.targets)  # the label columns: other range requests


@pytest.mark.parametrize("kind", sorted(AUTHS))
@pytest.mark.parametrize("code", [301, 302, 307, 308])
def test_credentials_do_not_follow_a_redirect_to_another_port(data, servers, tmp_path, kind, code):
    a, b = servers
    a.redirect = (code, b.url)
    _read_all(_dataset(data, tmp_path, a, kind), data)
    moved = [r for r in b.seen if r[1].startswith(MOVED)]
    assert moved and len(moved) == len(b.seen)
    leaked = [(m, p) for m, p, h in moved if _credentialed(h)]
    assert leaked == [], f"{len(leaked)} of {len(moved)} requests to {b.url} carried the credentials"
    assert a.seen and all(_credentialed(h) for _, _, h in a.seen)  # the configured origin still gets them


@pytest.mark.parametrize("kind", sorted(AUTHS))
@pytest.mark.parametrize("code", [302, 307])
def test_credentials_do_not_follow_a_redirect_to_localhost_on_the_same_port(data, servers, tmp_path, kind, code):
    a, _ = servers
    a.redirect = (code, f"http://localhost:{a.port}")
    _read_all(_dataset(data, tmp_path, a, kind), data)
    moved = [h for _, p, h in a.seen if p.startswith(MOVED)]
    assert moved and all(h.get("Host", "").startswith("localhost") for h in moved)
    assert sum(map(_credentialed, moved)) == 0, "127.0.0.1 -> localhost is another origin"


@pytest.mark.parametrize("kind", sorted(AUTHS))
def test_a_redirect_inside_the_same_origin_keeps_the_credentials(data, servers, tmp_path, kind):
    a, _ = servers
    a.redirect = (302, a.url)
    _read_all(_dataset(data, tmp_path, a, kind), data)
    moved = [h for _, p, h in a.seen if p.startswith(MOVED)]
    assert moved and all(map(_credentialed, moved))

