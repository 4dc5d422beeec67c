"""Range reads from a DVC remote that trust nothing: timeouts, bounded retries with exponential backoff, exact
lengths, a check of the bytes before they are used, and errors that name the URL (never a secret).

`Policy` holds the limits (the `from_dvc` parameters); `Fetcher` reads through an fsspec filesystem built per
process with them (aiohttp's connect / read / total timeouts for http(s), botocore's for s3) and the remote's
credentials. `Fetcher.retry(url, what, attempt)` runs `attempt()` until it returns, retrying what may pass
(timeouts, dropped connections, 5xx, bytes that fail their check: `Corrupt`), and turns what will not (a 404, a
refused credential, a server that ignores Range) into one clear `RemoteError`."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from .dvcconfig import AUTH_HELP, Remote, RemoteError

T = TypeVar("T")


class Corrupt(Exception):
    """Bytes from the remote that fail their check (length, Parquet structure, sha256): fetched again."""


class Final(Exception):
    """An error of the reader's own that no retry mends (raised as it is: e.g. cache.NoRoom)."""


@dataclass(frozen=True)
class Policy:
    """Limits of every remote request: seconds to connect, seconds without a byte while reading, seconds for all
    the tries at one object (range) together, retries after the first try, the first backoff (doubled each time).
    The defaults turn a stalled server into an error within a minute."""

    connect_timeout: float = 5.0
    read_timeout: float = 15.0
    object_timeout: float = 45.0
    retries: int = 3
    retry_backoff: float = 0.5

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "read_timeout", "object_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: expected seconds > 0, found {getattr(self, name)!r}")
        if self.retries < 0 or self.retry_backoff < 0:
            raise ValueError(f"retries, retry_backoff: expected >= 0, found {self.retries!r}, {self.retry_backoff!r}")


def open_filesystem(remote: Remote, policy: Policy) -> Any:
    """The fsspec filesystem of `remote` with `policy`'s timeouts (and no retries of its own: Fetcher retries)."""
    import fsspec

    options = {k: v for k, v in remote.credentials().items() if k != "auth"}
    if remote.protocol in ("http", "https"):
        options["client_kwargs"] = http_client(remote, policy)
    elif remote.protocol == "s3":
        options["config_kwargs"] = {
            "connect_timeout": policy.connect_timeout,
            "read_timeout": policy.read_timeout,
            "retries": {"max_attempts": 1},
        }
    return fsspec.filesystem(remote.protocol, skip_instance_cache=True, **options)


def http_client(remote: Remote, policy: Policy) -> dict[str, Any]:
    """aiohttp.ClientSession's arguments: `policy`'s timeouts, and the remote's credentials as a middleware that
    adds them to the requests to the remote's origin only — aiohttp runs it on every hop of a redirect, so a
    redirect to another origin (scheme, host, port) gets none, as with curl or requests. (A session's `auth=` is
    sent again after a cross-origin redirect, and its `headers=` always.)"""
    import aiohttp

    client: dict[str, Any] = {
        "timeout": aiohttp.ClientTimeout(
            total=policy.object_timeout,
            sock_connect=policy.connect_timeout,
            connect=policy.connect_timeout,
            sock_read=policy.read_timeout,
        )
    }
    auth = remote.credentials().get("auth")
    if auth:
        if tuple(int(p) for p in aiohttp.__version__.split(".")[:2]) < (3, 12):
            raise RemoteError(
                f"{remote.shown(remote.url)}: credentials need aiohttp >= 3.12 (its client middlewares keep "
                f"them to the remote's origin), found aiohttp {aiohttp.__version__}; pip install 'aiohttp>=3.12'"
            )
        client["middlewares"] = (OriginAuth(remote.url, auth_headers(auth)),)
    return client


def auth_headers(auth: tuple[str, str, str]) -> dict[str, str]:
    """The request headers of ("basic", user, password) or ("custom", header, value)."""
    if auth[0] == "basic":
        token = base64.b64encode(f"{auth[1]}:{auth[2]}".encode()).decode("ascii")
        return {"Authorization": f"Basic {token}"}
    return {auth[1]: auth[2]}


def origin(url: Any) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL (str or yarl.URL), the default port made explicit."""
    from yarl import URL

    url = URL(str(url))
    return (url.scheme.lower(), (url.host or "").lower(), url.port)


class OriginAuth:
    """An aiohttp client middleware: `headers` (the credentials) on the requests to `url`'s origin, and removed
    from any other (aiohttp calls it once per request, each redirect hop included)."""

    def __init__(self, url: str, headers: dict[str, str]):
        self.origin, self.headers = origin(url), headers

    def __repr__(self) -> str:
        return f"OriginAuth({self.origin}, {sorted(self.headers)})"

    async def __call__(self, request: Any, handler: Any) -> Any:
        for name in self.headers:
            request.headers.popall(name, None)
        if origin(request.url) == self.origin:
            request.headers.update(self.headers)
        return await handler(request)


class Fetcher:
    """Reads of `remote` under `policy`; picklable (the filesystem is rebuilt in each process)."""

    _fs: Any

    def __init__(self, remote: Remote, policy: Policy):
        self.remote, self.policy = remote, policy
        self._pid, self._fs = os.getpid(), None

    def __getstate__(self) -> dict[str, Any]:
        return {"remote": self.remote, "policy": self.policy}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid, self._fs = os.getpid(), None

    @property
    def fs(self) -> Any:
        if self._fs is None or self._pid != os.getpid():
            self._pid, self._fs = os.getpid(), open_filesystem(self.remote, self.policy)
        return self._fs

    def size(self, url: str) -> int:
        """The object's size (a HEAD request over http); FileNotFoundError when there is none."""
        return self.retry(url, "its size", lambda: int(self.fs.size(url)))

    def read(self, url: str, start: int, end: int) -> bytes:
        """Exactly bytes [start, end) of `url`, one range request (no retry here: call it inside `retry`).
        Corrupt when the reply has another length."""
        if end <= start:
            return b""
        # size=end: fsspec then asks for no HEAD first and never reads past `end`
        with self.fs.open(url, "rb", block_size=end - start, cache_type="none", size=end) as fh:
            fh.seek(start)
            data = bytes(fh.read(end - start))
        if len(data) != end - start:
            raise Corrupt(f"expected {end - start} bytes at {start}, found {len(data)}")
        return data

    def retry(self, url: str, what: str, attempt: Callable[[], T]) -> T:
        """`attempt()`, tried again on errors that may pass, within `policy`; else one RemoteError."""
        policy, started = self.policy, time.monotonic()
        delay, tries, last = policy.retry_backoff, 0, None
        while True:
            tries += 1
            try:
                return attempt()
            except Exception as err:  # classified: final ones raised at once, the rest retried (bounded)
                self._raise_final(url, what, err)
                last = err
            if tries > policy.retries or time.monotonic() + delay - started >= policy.object_timeout:
                break
            time.sleep(delay)
            delay *= 2
        raise self._give_up(url, what, last, tries, time.monotonic() - started)

    def _give_up(self, url: str, what: str, last: BaseException | None, tries: int, seconds: float) -> RemoteError:
        """The error of `tries` failed tries at `url`: a server error (5xx, 429) by its status, else in words."""
        policy, shown = self.policy, self.remote.shown(url)
        limits = f"{tries} tries in {seconds:.1f} s (retries={policy.retries}, object_timeout={policy.object_timeout}"
        limits += " s)"
        status = next((s for s in _statuses(last) if s >= 500 or s == 429), None)
        if status is not None:
            replies = (e for e in _chain(last) if getattr(e, "status", 0) == status)
            reason = next((str(getattr(e, "message", "")) for e in replies), "")
            return RemoteError(
                f"{shown}: {what}: the server answered HTTP {status}{f' ({reason})' if reason else ''} to every try, "
                f"{limits}; the server is failing or overloaded, not the object missing — check the server (its "
                "logs, its disk) or try again later, with larger retries/object_timeout passed to from_dvc"
            )
        return RemoteError(
            f"{shown}: {what}: {self.describe(last)}; gave up after {limits} — check the server and the network, "
            "or pass larger timeouts/retries to from_dvc"
        )

    def describe(self, err: BaseException | None) -> str:
        """What went wrong, in words, with no secret in them."""
        if isinstance(err, Corrupt):
            return f"{err}: the server returned other bytes than asked for"
        if any(isinstance(e, TimeoutError) for e in _chain(err)):
            return (
                f"timed out (connect_timeout={self.policy.connect_timeout} s, "
                f"read_timeout={self.policy.read_timeout} s)"
            )
        return self.remote.scrub(f"{type(err).__name__}: {err}")

    def _raise_final(self, url: str, what: str, err: Exception) -> None:
        """Raise what retrying cannot mend: a missing object (FileNotFoundError), refused credentials, a server
        that ignores Range, and our own RemoteErrors; return for the rest."""
        shown = self.remote.shown(url)
        statuses: list[Any] = _statuses(err)
        if 401 in statuses or 403 in statuses or isinstance(err, PermissionError):
            code = next((s for s in statuses if s in (401, 403)), "access denied")
            raise RemoteError(f"{shown}: the server refused the credentials (HTTP {code}); {AUTH_HELP}") from None
        if 404 in statuses or (isinstance(err, FileNotFoundError) and not _transient(statuses, err)):
            raise FileNotFoundError(shown) from None
        if isinstance(err, ValueError) and "support range requests" in str(err):
            raise RemoteError(
                f"{shown}: {what}: the server ignores Range requests (it answered 200 with the whole object "
                "instead of 206 with the bytes asked for); serve the remote with a server that answers byte "
                "ranges (nginx, Apache, S3 — not `python -m http.server`)"
            ) from None
        if isinstance(err, (RemoteError, Final)):
            raise err


def _chain(err: BaseException | None) -> Iterator[BaseException]:
    """`err` and what caused it (fsspec wraps a failed HEAD in FileNotFoundError)."""
    seen = 0
    while err is not None and seen < 8:
        yield err
        err, seen = err.__cause__ or err.__context__, seen + 1


def _statuses(err: BaseException | None) -> list[int]:
    """The HTTP statuses in `err`'s chain (aiohttp's ClientResponseError.status), outermost first."""
    found = (getattr(e, "status", None) for e in _chain(err))
    return [s for s in found if isinstance(s, int) and not isinstance(s, bool)]


def _transient(statuses: list[Any], err: BaseException) -> bool:
    """A FileNotFoundError that fsspec made of a timeout, a dropped connection or a 5xx."""
    causes = list(_chain(err))[1:]
    return any(isinstance(s, int) and (s >= 500 or s == 429) for s in statuses) or any(
        isinstance(e, (TimeoutError, ConnectionError)) or type(e).__module__.startswith("aiohttp") for e in causes
    )
