"""Which shard files a DVC-tracked version holds, and where its remote keeps them — without DVC installed.

Reads `dvc.lock` (PyYAML, the `remote` extra) and `.dvc/config` (+ the git-ignored `.dvc/config.local`) of a
checkout, at `rev` through `git show` when given; finds the out that holds `path` (its `<md5>.dir`), fetches that
`.dir` object (a JSON list of {"md5", "relpath"}) from the remote and keeps the `*.parquet` entries under `path`.
Remote layout: DVC 3 stores content at `<url>/files/md5/<2 hex>/<30 hex>` (DVC 2: `<url>/<2>/<30>`, tried next).
Only the listing is trusted for names: nothing here depends on how the shard files are named."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

_CREDENTIAL_KEYS = {"access_key_id": "key", "secret_access_key": "secret", "session_token": "token"}


class RemoteError(ValueError):
    """A DVC project or remote that cannot be read as expected; the message says what to do."""


@dataclass(frozen=True)
class Remote:
    """A DVC remote as fsspec sees it: a URL and the filesystem's options (never written anywhere)."""

    url: str
    options: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def protocol(self) -> str:
        return self.url.split("://", 1)[0] if "://" in self.url else "file"

    def filesystem(self) -> Any:
        import fsspec

        return fsspec.filesystem(self.protocol, **self.options)

    def object_urls(self, md5: str) -> list[str]:
        """Candidate URLs of content `md5` (DVC 3 layout first, then DVC 2)."""
        base = self.url.rstrip("/")
        return [f"{base}/files/md5/{md5[:2]}/{md5[2:]}", f"{base}/{md5[:2]}/{md5[2:]}"]


def read_project_file(repo: Path, name: str, rev: str | None) -> str | None:
    """`name` (relative to the checkout) in the working tree, or at git `rev`; None when absent."""
    if rev is None:
        path = repo / name
        return path.read_text(encoding="utf-8") if path.is_file() else None
    out = subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{name}"], capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


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
            return str(root), str(out["md5"])
    raise RemoteError(
        f"{repo}/dvc.lock: expected an out holding {path!r}, found outs "
        f"{sorted(o['path'] for o in outs)}; pass a path under one of them"
    )


def parse_config(text: str) -> dict[str, dict[str, str]]:
    """DVC's INI config (configobj) as {section: {key: value}}; `['remote "s3"']` -> section 'remote "s3"'.
    Hand-written: configparser reads DVC's indented keys as continuation lines."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            title = line.strip("[]").strip()
            current = sections.setdefault(title[1:-1] if title[:1] == title[-1:] == "'" else title, {})
        elif "=" in line and current is not None:
            key, value = line.split("=", 1)
            current[key.strip()] = value.strip().strip("'\"")
    return sections


def find_remote(repo: Path, rev: str | None, name: str | None) -> Remote:
    """The remote `name` (default: core.remote) from .dvc/config + .dvc/config.local; a URL is used as is."""
    if name and ("://" in name or name.startswith("/")):
        return Remote(name)
    config: dict[str, dict[str, str]] = {}
    for file, at in ((".dvc/config", rev), (".dvc/config.local", None)):  # config.local is never committed
        for title, values in parse_config(read_project_file(repo, file, at) or "").items():
            config.setdefault(title, {}).update(values)
    name = name or config.get("core", {}).get("remote")
    section = config.get(f'remote "{name}"') if name else None
    if not section or "url" not in section:
        known = sorted(s.split('"')[1] for s in config if s.startswith("remote "))
        raise RemoteError(
            f"{repo}/.dvc/config: expected remote {name or '(core.remote)'} with a url, found "
            f"remotes {known}; pass remote= (a name or a URL) or run scripts/remote.sh"
        )
    url = section["url"]
    if "://" not in url and not os.path.isabs(url):  # DVC resolves local remotes against the config's directory
        url = str((repo / ".dvc" / url).resolve())
    return Remote(url, _options(url, section))


def _options(url: str, section: dict[str, str]) -> dict[str, Any]:
    """fsspec options from the remote's section; credentials otherwise come from the environment as usual."""
    if not url.startswith("s3://"):
        return {}
    options: dict[str, Any] = {}
    if "endpointurl" in section:
        options["endpoint_url"] = section["endpointurl"]
    if "region" in section:
        options["client_kwargs"] = {"region_name": section["region"]}
    if "profile" in section:
        options["profile"] = section["profile"]
    options.update({ours: section[theirs] for theirs, ours in _CREDENTIAL_KEYS.items() if theirs in section})
    return options


def fetch_object(remote: Remote, fs: Any, md5: str) -> bytes:
    """The bytes of content `md5` in the remote."""
    for url in remote.object_urls(md5):
        try:
            return bytes(fs.cat_file(url))
        except FileNotFoundError:
            continue
    raise RemoteError(
        f"{remote.url}: expected object {md5} (files/md5/{md5[:2]}/{md5[2:]}), found none; "
        "run `dvc push` in the project, or pass the remote that holds it"
    )


def list_shards(remote: Remote, fs: Any, out: str, md5: str, path: str) -> list[tuple[str, str]]:
    """[(name, md5)] of the `*.parquet` files directly in `path` (as find_shards globs a local directory),
    sorted by name."""
    if not md5.endswith(".dir"):
        return [(PurePosixPath(out).name, md5)] if out.endswith(".parquet") else []
    data = fetch_object(remote, fs, md5)
    sub = str(PurePosixPath(path).relative_to(out))
    prefix = "" if sub == "." else sub.rstrip("/") + "/"
    entries = json.loads(data)
    names = [(e["relpath"][len(prefix) :], e["md5"]) for e in entries if e["relpath"].startswith(prefix)]
    return sorted((name, md5) for name, md5 in names if "/" not in name and name.endswith(".parquet"))
