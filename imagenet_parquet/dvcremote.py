"""Which shard files a DVC-tracked version holds, and where its remote keeps them — without DVC installed.

Reads `dvc.lock` (PyYAML, the `remote` extra) of a checkout, at `rev` through `git show` when given; finds the out
that holds `path` (its `<md5>.dir`), fetches that `.dir` object (a JSON list of {"md5", "relpath"}) from the
remote (dvcconfig.py: which one, with which credentials) and keeps the `*.parquet` entries under `path`.
Remote layout: DVC 3 stores content at `<url>/files/md5/<2 hex>/<30 hex>` (DVC 2: `<url>/<2>/<30>`, tried next).
Only the listing is trusted for names (nothing here depends on how the shard files are named), and only once it
matches the md5 dvc.lock gives it; every object name in it must be 32 hex digits (it becomes a cache directory)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from .dvcconfig import AUTH_HELP, ENV_PASSWORD, ENV_USER, Remote, RemoteError, find_remote, read_project_file, redact

if TYPE_CHECKING:
    from .cache import Cache
    from .fetch import Fetcher

__all__ = [
    "AUTH_HELP",
    "ENV_PASSWORD",
    "ENV_USER",
    "LISTING_LIMIT",
    "Remote",
    "RemoteError",
    "check_md5",
    "fetch_listing",
    "find_remote",
    "list_shards",
    "lock_out",
    "read_project_file",
    "redact",
]
_MD5 = re.compile(r"[0-9a-f]{32}")
LISTING_LIMIT = 256 << 20  # a .dir listing larger than this is not a listing (ImageNet's: ~100 KB)


def lock_out(repo: Path, path: str, rev: str | None) -> tuple[str, str]:
    """(out path, md5) of the dvc.lock out that is `path` or holds it."""
    text = read_project_file(repo, "dvc.lock", rev)
    if text is None:
        raise RemoteError(
            f"{repo}: expected dvc.lock{f' at {rev}' if rev else ''}, found none; pass the project "
            "checkout that ran `dvc repro` (or a rev that has its dvc.lock)"
        )
    try:
        import yaml
    except ImportError:
        raise RemoteError("reading dvc.lock needs PyYAML: pip install 'imagenet-parquet[remote]'") from None
    target = PurePosixPath(path)
    outs = [o for stage in (yaml.safe_load(text) or {}).get("stages", {}).values() for o in stage.get("outs", [])]
    for out in outs:
        root = PurePosixPath(out["path"])
        if (target == root or root in target.parents) and out.get("md5"):
            md5 = str(out["md5"])
            check_md5(md5.removesuffix(".dir"), f"{repo}/dvc.lock", out["path"])
            return str(root), md5
    raise RemoteError(
        f"{repo}/dvc.lock: expected an out holding {path!r}, found outs "
        f"{sorted(o['path'] for o in outs)}; pass a path under one of them"
    )


def check_md5(value: str, where: str, what: str) -> str:
    """`value`, when it is an md5 (32 hex digits: an object name, a cache directory); else a RemoteError."""
    if not _MD5.fullmatch(str(value)):
        raise RemoteError(
            f"{where}: expected 32 hex digits as the md5 of {what!r}, found {value!r}; the listing was "
            "altered — run `dvc push` again from a checkout you trust"
        )
    return value


def fetch_listing(fetcher: Fetcher, md5: str, cache: Cache | None = None) -> bytes:
    """The `.dir` object `md5` (bounded by LISTING_LIMIT), checked against that md5; kept in `cache` (the node's:
    a restart then asks the remote for nothing), checked again when read from it."""
    if cache is not None:
        path = cache.root / md5 / "listing"
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_size <= LISTING_LIMIT and hashlib.md5(data := path.read_bytes()).hexdigest() == md5[:32]:
                return data
            path.unlink()  # changed since it was cached
        data = fetch_listing(fetcher, md5)  # checked before anything is cached
        cache.close(cache.open_or_fill(md5, "listing", lambda fd: cache.write(fd, data, 0)))
        return data
    remote = fetcher.remote
    for url in remote.object_urls(md5):
        try:
            return _read_listing(fetcher, url, md5.removesuffix(".dir"))
        except FileNotFoundError:
            continue
    raise RemoteError(
        f"{remote.shown(remote.url)}: expected object {md5} (files/md5/{md5[:2]}/{md5[2:]}), found none; "
        "run `dvc push` in the project, or pass the remote that holds it"
    )


def _read_listing(fetcher: Fetcher, url: str, md5: str) -> bytes:
    size, shown = fetcher.size(url), fetcher.remote.shown(url)
    if size > LISTING_LIMIT:
        raise RemoteError(f"{shown}: expected a .dir listing, found {size} bytes; run `dvc push` again")
    data = fetcher.retry(url, "the listing", lambda: fetcher.read(url, 0, size))
    found = hashlib.md5(data).hexdigest()
    if found != md5:
        raise RemoteError(
            f"{shown}: expected the listing to have md5 {md5} (dvc.lock), found {found}; the remote holds other "
            "bytes under that name — run `dvc push` again, or pass the remote that holds this version"
        )
    return data


def list_shards(fetcher: Fetcher, out: str, md5: str, path: str, cache: Cache | None = None) -> list[tuple[str, str]]:
    """[(name, md5)] of the `*.parquet` files directly in `path` (as find_shards globs a local directory),
    sorted by name."""
    if not md5.endswith(".dir"):
        return [(PurePosixPath(out).name, md5)] if out.endswith(".parquet") else []
    where = fetcher.remote.shown(fetcher.remote.object_urls(md5)[0])
    data = fetch_listing(fetcher, md5, cache)
    try:
        entries = json.loads(data)
        pairs = [(str(e["relpath"]), e["md5"]) for e in entries]
    except (ValueError, TypeError, KeyError) as err:
        raise RemoteError(f"{where}: expected a JSON list of {{md5, relpath}}, found: {err}") from None
    sub = str(PurePosixPath(path).relative_to(out))
    prefix = "" if sub == "." else sub.rstrip("/") + "/"
    names = [(rel[len(prefix) :], check_md5(obj, where, rel)) for rel, obj in pairs if rel.startswith(prefix)]
    return sorted((name, obj) for name, obj in names if "/" not in name and name.endswith(".parquet"))
