"""A DVC checkout whose shards sit in a directory remote, written without DVC (dvc.lock, .dvc/config, the `.dir`
listing and the objects under files/md5), and a Range server on 127.0.0.1 that records every request's headers
and can redirect (issue 28: credentials must not follow a redirect to another origin).

RecordingServer: a RangeServer that keeps (method, path, headers) of every request in `seen`. With `redirect =
(code, base)` it answers every request whose path does not start with /moved (after checking `auth`) with `code`
and `Location: <base>/moved<path>`; paths under /moved are served from `root` (the prefix stripped) without any
credential check — the other origin, a CDN that needs none."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq

from tasks.common.shard_writer import ShardWriter
from tests.helpers.datasets import write_shards
from tests.helpers.servers import RangeServer, _Handler

TOTAL = 20
MOVED = "/moved"


def build_checkout(root: Path, total: int = TOTAL) -> dict[str, Path]:
    """{"checkout", "remote", "local"}: `local` holds the train shards (2 files of 5-row groups with the footer
    byte index), `remote` a DVC 3 directory remote holding them, `checkout` a dvc.lock + .dvc/config whose out
    data/parquet is them (remote "store", a directory; tests add their own remotes with `add_remote`)."""
    local, remote, checkout = root / "local", root / "remote", root / "checkout"
    entries = []
    for path in write_shards(local, "train", total=total, shards=2, row_group_rows=5):
        table = pq.read_table(path)  # rewritten as convert writes: with the footer's byte index
        ShardWriter(path, table.schema, 5).write(iter(table.to_pylist()))
        entries.append({"md5": _put(remote, path.read_bytes()), "relpath": f"train/{path.name}"})
    md5 = _put(remote, json.dumps(entries).encode()) + ".dir"
    (remote / "files" / "md5" / md5[:2] / md5[2:-4]).rename(remote / "files" / "md5" / md5[:2] / md5[2:])
    (checkout / ".dvc").mkdir(parents=True)
    (checkout / "dvc.lock").write_text(f"schema: '2.0'\nstages:\n  convert:\n    cmd: 'true'\n    outs:\n"
                                       f"    - path: data/parquet\n      hash: md5\n      md5: {md5}\n")
    (checkout / ".dvc" / "config").write_text(f"[core]\n    remote = store\n['remote \"store\"']\n    url = {remote}\n")
    return {"checkout": checkout, "remote": remote, "local": local}


def _put(remote: Path, data: bytes) -> str:
    md5 = hashlib.md5(data).hexdigest()
    obj = remote / "files" / "md5" / md5[:2] / md5[2:]
    obj.parent.mkdir(parents=True, exist_ok=True)
    obj.write_bytes(data)
    return md5


def publish(repo: Path, remote: Path, outs: list[str]) -> None:
    """dvc.lock naming `outs` (directories under `repo`) as written by DVC 3, their `.dir` listings in the local
    cache and, with every file, in the directory remote `remote` (the default remote): `dvc push` without DVC."""
    lines = ["schema: '2.0'", "stages:"]
    for n, out in enumerate(outs):
        files = sorted(p for p in (repo / out).rglob("*") if p.is_file())
        entries = [{"md5": _put(remote, f.read_bytes()), "relpath": f.relative_to(repo / out).as_posix()} for f in files]
        listing = json.dumps(entries).encode()
        md5 = _put(remote, listing)
        _put(repo / ".dvc" / "cache", listing)
        for store in (remote, repo / ".dvc" / "cache"):
            obj = store / "files" / "md5" / md5[:2] / md5[2:]
            obj.rename(obj.with_name(obj.name + ".dir"))
        lines += [f"  s{n}:", "    cmd: 'true'", "    outs:", f"    - path: {out}", "      hash: md5",
                  f"      md5: {md5}.dir"]
    (repo / "dvc.lock").write_text("\n".join(lines) + "\n")
    (repo / ".dvc" / "config").write_text(f"[core]\n    remote = store\n['remote \"store\"']\n    url = {remote}\n")


def add_remote(checkout: Path, name: str, url: str, section: str = "", local: str = "") -> None:
    """Remote `name` at `url` in .dvc/config (plus `section` lines) and `local` lines in .dvc/config.local."""
    config = checkout / ".dvc" / "config"
    config.write_text(config.read_text() + f"['remote \"{name}\"']\n    url = {url}\n{section}")
    if local:
        path = checkout / ".dvc" / "config.local"
        old = path.read_text() if path.exists() else ""
        path.write_text(old + f"['remote \"{name}\"']\n{local}")


class _Recording(_Handler):
    server: RecordingServer

    def _serve(self, body: bool) -> None:
        srv = self.server
        srv.seen.append((self.command, self.path, dict(self.headers.items())))
        if srv.storm:
            return self._empty(srv.storm)
        self.moved = self.path.startswith(MOVED)
        if self.moved:
            self.path = self.path[len(MOVED):]
            return super()._serve(body)
        if srv.redirect is not None:
            if not self._authorized():
                return self._empty(401, {"WWW-Authenticate": 'Basic realm="test"'})
            code, base = srv.redirect
            return self._empty(code, {"Location": f"{base}{MOVED}{self.path}"})
        return super()._serve(body)


    def _authorized(self) -> bool:
        return self.moved or super()._authorized()  # the other origin wants no credential


class RecordingServer(RangeServer):
    def __init__(self, root: Path, port: int = 0) -> None:
        super().__init__(root, port)
        self.RequestHandlerClass = _Recording
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.redirect: tuple[int, str] | None = None
        self.storm: int | None = None  # a status every request gets (a 5xx storm)

    @property
    def port(self) -> int:
        return int(self.server_address[1])
