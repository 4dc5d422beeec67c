"""Which remote a DVC checkout names and how to reach it — without DVC installed: `.dvc/config` (+ the git-ignored
`.dvc/config.local`) of a checkout, at `rev` through `git show` when given, or a URL.

HTTP credentials follow DVC's remote options (`auth = basic | custom`, `user`, `password`, `custom_auth_header`;
secrets belong in `.dvc/config.local`) or IMAGENET_PARQUET_HTTP_USER / IMAGENET_PARQUET_HTTP_PASSWORD, or a URL's
`user:password@`: they are kept out of the URL, of every message, of `repr(Remote)` and of its pickles. A `Remote`
remembers where they came from (`source`) and an unpickled copy — a DataLoader worker — reads them again there
when it first needs them (a password given inside a `remote=` URL: from this process's memory, which forked
processes share and spawned ones do not; there, from the environment)."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

_CREDENTIAL_KEYS = {"access_key_id": "key", "secret_access_key": "secret", "session_token": "token"}
ENV_USER, ENV_PASSWORD = "IMAGENET_PARQUET_HTTP_USER", "IMAGENET_PARQUET_HTTP_PASSWORD"
AUTH_HELP = (
    "check `auth`, `user` and `password` (or `custom_auth_header`) of the remote in .dvc/config and "
    f".dvc/config.local (`dvc remote modify --local NAME password ...`), or set {ENV_USER} / {ENV_PASSWORD}"
)
SECRET_KEYS = frozenset({"auth", "key", "secret", "token"})  # kept out of pickles (Remote.__getstate__)
_URL_SECRETS: dict[str, str] = {}  # passwords given inside a remote= URL, by key (Remote.source): never pickled


class RemoteError(ValueError):
    """A DVC project or remote that cannot be read as expected; the message says what to do."""


@dataclass(frozen=True)
class Remote:
    """A DVC remote as fsspec sees it: a URL and the filesystem's options (never written anywhere). Pickled (for
    DataLoader workers) without its secrets (SECRET_KEYS): `credentials()` re-reads them in the process that
    unpickled it, from where they came from (`source`: the DVC config + config.local, the environment)."""

    url: str
    options: dict[str, Any] = field(default_factory=dict, repr=False)
    user: str | None = None  # shown as `user:***@` in messages (the URL itself carries no credentials)
    source: tuple[str, ...] | None = field(default=None, repr=False, compare=False)  # see credentials.reread

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["options"] = {k: v for k, v in self.options.items() if k not in SECRET_KEYS}
        state["withheld"] = sorted(set(self.options) & SECRET_KEYS) or state.get("withheld")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def credentials(self) -> dict[str, Any]:
        """`options` with the secrets, re-read from `source` first in a process that unpickled this Remote."""
        if self.__dict__.get("withheld"):
            self.__dict__["options"] = _reread(self, self.__dict__["withheld"])
            self.__dict__["withheld"] = None
        return self.options

    def shown(self, url: str) -> str:
        """`url` as messages show it: `user:***@` where the remote has a user, never a password."""
        url = redact(url)
        if self.user and "://" in url and "@" not in url.split("://", 1)[1].split("/", 1)[0]:
            scheme, rest = url.split("://", 1)
            url = f"{scheme}://{self.user}:***@{rest}"
        return url

    def scrub(self, text: str) -> str:
        """`text` with every secret of this remote replaced by ***."""
        text = redact(text)
        auth = self.options.get("auth")
        secrets = [auth[2]] if auth else []
        secrets += [str(self.options[k]) for k in ("secret", "token") if self.options.get(k)]
        for secret in secrets:
            text = text.replace(secret, "***")
        return text

    @property
    def protocol(self) -> str:
        return self.url.split("://", 1)[0] if "://" in self.url else "file"

    def object_urls(self, md5: str) -> list[str]:
        """Candidate URLs of content `md5` (DVC 3 layout first, then DVC 2)."""
        base = self.url.rstrip("/")
        return [f"{base}/files/md5/{md5[:2]}/{md5[2:]}", f"{base}/{md5[:2]}/{md5[2:]}"]


def read_project_file(repo: Path, name: str, rev: str | None) -> str | None:
    """`name` (relative to the checkout) in the working tree, or at git `rev`; None when absent."""
    if rev is None:
        path = repo / name
        return path.read_text(encoding="utf-8") if path.is_file() else None
    if not rev or rev.startswith("-") or any(c.isspace() or c == ":" for c in rev):
        raise RemoteError(
            f"rev: expected a git revision (a commit, branch or tag), found {rev!r}; a revision never starts "
            "with '-' nor holds spaces or ':'"
        )
    cmd = ["git", "-C", str(repo), "show", "--end-of-options", f"{rev}:{name}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


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
        return _remote(name, {}, None, _url_source(name))
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
    return _remote(url, section, name, ("dvc", str(repo.resolve()), rev or "", name or ""))


def _remote(url: str, section: dict[str, str], name: str | None, source: tuple[str, ...] | None = None) -> Remote:
    """The Remote of `url` (credentials moved out of it) and its config `section`, read from `source`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return Remote(url, _options(url, section), source=source)
    section = dict(section)
    if parts.username is not None:
        section.setdefault("user", unquote(parts.username))
        if parts.password is not None:
            section.setdefault("password", unquote(parts.password))
        section.setdefault("auth", "basic")
        url = urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    auth = _http_auth(section, name)
    user = section.get("user") if auth and auth[0] == "basic" else None
    return Remote(url, {"auth": auth} if auth else {}, user, source)


def _url_source(url: str) -> tuple[str, ...]:
    """("url", `url` without its password, a key of _URL_SECRETS that holds it): re-read by a forked process."""
    parts = urlsplit(url)
    if parts.password is None:
        return ("url", url)
    key = os.urandom(8).hex()
    _URL_SECRETS[key] = unquote(parts.password)
    user, host = parts.netloc.rsplit("@", 1)
    return ("url", urlunsplit(parts._replace(netloc=f"{user.split(':', 1)[0]}@{host}")), key)


def _reread(remote: Remote, withheld: list[str]) -> dict[str, Any]:
    """`remote`'s options with its secrets, read again from `remote.source` (in an unpickled copy)."""
    kind, *where = remote.source or ("none",)
    again, looked, problem = None, "nowhere (no record of where they came from)", ""
    try:
        if kind == "dvc":
            looked = f"{where[0]}/.dvc/config, .dvc/config.local and the environment"
            again = find_remote(Path(where[0]), where[1] or None, where[2] or None)
        elif kind == "url":
            looked = "this process's memory (the remote= URL) and the environment"
            password = _URL_SECRETS.get(where[1]) if len(where) > 1 else None
            again = _remote(where[0], {"password": password} if password else {}, None)
    except RemoteError as err:
        problem = f" ({err})"
    if again is not None and again.url == remote.url and set(withheld) <= set(again.options):
        return again.options
    hint = "a password inside a URL passed as remote= reaches forked processes only; " if kind == "url" else ""
    raise RemoteError(
        f"{remote.shown(remote.url)}: expected the remote's credentials ({', '.join(withheld)}) in this process, "
        f"which re-reads them (they are never pickled; a DataLoader worker is such a process), found none in "
        f"{looked}{problem}; {hint}{AUTH_HELP}"
    )


def _http_auth(section: dict[str, str], name: str | None) -> tuple[str, str, str] | None:
    """("basic", user, password) or ("custom", header, password) as DVC's HTTP remote reads them; None: none."""
    method = section.get("auth")
    if not method:
        return None
    user = section.get("user") or os.environ.get(ENV_USER)
    password = section.get("password") or os.environ.get(ENV_PASSWORD)
    where = f"remote {name or '(a URL)'}"
    header = section.get("custom_auth_header")
    if method == "basic" and user and password:
        return ("basic", user, password)
    if method == "custom" and header and password:
        return ("custom", header, password)
    if method in ("basic", "custom"):
        need = "`user` and `password`" if method == "basic" else "`custom_auth_header` and `password`"
        raise RemoteError(f"{where}: expected {need} for auth = {method}, found some missing; {AUTH_HELP}")
    raise RemoteError(f"{where}: expected auth = basic or custom (DVC's HTTP remote), found {method!r}")


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


def redact(text: str) -> str:
    """`text` with the password of any `scheme://user:password@` replaced by ***."""
    return re.sub(r"(://[^/\s:@]*):[^/\s@]*@", r"\1:***@", text)
