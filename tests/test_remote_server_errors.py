"""A remote that answers 5xx to everything is reported as what it is — one line naming the URL
(without credentials), the HTTP status and what to do — never as a missing object (FileNotFoundError, "not found"),
whichever request meets it first: the listing's HEAD, a footer, a row group, the label columns."""
from __future__ import annotations

from pathlib import Path

import pytest

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset
from imagenet_parquet.dvcremote import RemoteError
from tests.helpers.http_remote import RecordingServer, build_checkout

SECRET = "pw-i28-storm"
FAST = {"connect_timeout": 2.0, "read_timeout": 5.0, "object_timeout": 20.0, "retries": 1, "retry_backoff": 0.01}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return build_checkout(tmp_path_factory.mktemp("storm"))


@pytest.fixture
def server(data):
    with RecordingServer(data["remote"]) as srv:
        srv.auth = ("basic", "alice", SECRET)
        yield srv


def _open(data, server, cache: Path, cls=ParquetImageDataset, **kw):
    url = server.url.replace("://", f"://alice:{SECRET}@")
    return cls.from_dvc(data["checkout"], "data/parquet/train", remote=url, decode=False, cache_dir=cache,
                        **{**FAST, **kw})


def _check(message: str, code: int, server) -> None:
    assert f"HTTP {code}" in message, message
    assert "FileNotFound" not in message and "not found" not in message.lower() and "dvc push" not in message
    assert f"alice:***@127.0.0.1:{server.server_address[1]}/files/md5/" in message and SECRET not in message
    assert "\n" not in message and "later" in message  # one line, and what to do


@pytest.mark.parametrize("code", [500, 502, 503])
@pytest.mark.parametrize("where", ["listing", "footer", "row group", "labels", "iterable"])
def test_a_5xx_storm_is_reported_with_its_status_never_as_not_found(data, server, tmp_path, where, code):
    if where in ("row group", "labels"):
        ds = _open(data, server, tmp_path / "cache")  # listing and footers read while the server was well
    if where == "iterable":
        ds = _open(data, server, tmp_path / "cache", cls=ParquetIterableDataset)
    server.storm = code
    with pytest.raises(RemoteError) as err:
        if where == "listing":
            _open(data, server, tmp_path / "fresh")
        elif where == "footer":
            server.storm = None
            _footer_storm(data, server, tmp_path, code)
        elif where == "row group":
            ds[7]
        elif where == "labels":
            ds.targets
        else:
            list(ds)
    _check(str(err.value), code, server)


def _footer_storm(data, server, tmp_path: Path, code: int) -> None:
    """The listing read well, the shards' sizes too (HEAD), then every GET of a shard answers `code`."""
    listing = next(p for p in data["remote"].rglob("*.dir"))
    shards = [p for p in data["remote"].rglob("*") if p.is_file() and p != listing]
    for shard in shards:
        path = "/" + str(shard.relative_to(data["remote"]))
        server.faults[path].extend([("status", code)] * 10)
    _open(data, server, tmp_path / "fresh")
