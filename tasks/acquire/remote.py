"""The network side of a download (tasks.acquire.fetch): what a source is (`kind`), its size, one request's
stream from an offset (http(s):// with Range, or any fsspec URL such as s3://), and how a source and a failed
attempt are shown (credentials redacted, the cause in a few words)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
import urllib3

from tasks.common import PipelineError
from tasks.common.params import DownloadParams

log = logging.getLogger(__name__)


class Transient(Exception):
    """One failed attempt (dropped connection, 5xx, short read): retried with backoff."""


@dataclass(frozen=True)
class FetchOptions:
    retries: int = 5
    backoff_s: float = 1.0
    timeout_s: float = 60.0
    chunk_bytes: int = 8 << 20
    progress: bool = True

    @classmethod
    def from_params(cls, params: DownloadParams) -> FetchOptions:
        return cls(params.retries, params.backoff_s, params.timeout_s, int(params.chunk_mb * (1 << 20)))


def redact(source: str) -> str:
    """The source with any user:password and query string (signatures, tokens) replaced by `***`."""
    parts = urlsplit(source)
    if not parts.scheme or parts.scheme == "file":
        return source
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "", ""))


def scrub(text: str, source: str) -> str:
    """`text` (an error message that may quote the URL) without the source's password, user or query."""
    parts = urlsplit(source)
    for secret in (parts.password, parts.username, parts.query):
        if secret:
            text = text.replace(secret, "***")
    return text


def kind(source: str) -> str:
    """sample | local | http | fsspec"""
    scheme = urlsplit(source).scheme
    if source == "sample":
        return "sample"
    if scheme in ("", "file") or len(scheme) == 1:  # a one-letter scheme is a Windows drive
        return "local"
    return "http" if scheme in ("http", "https") else "fsspec"


def remote_size(source: str, opts: FetchOptions) -> int | None:
    """Bytes a network source will bring (None when the server does not say or cannot be asked now)."""
    if kind(source) != "http":
        return _fsspec_size(source)
    try:
        resp = requests.head(source, allow_redirects=True, timeout=opts.timeout_s)
    except requests.RequestException as err:  # the download itself retries and reports
        log.warning("%s: size unknown (%s); free space not checked for it", redact(source), type(err).__name__)
        return None
    if resp.status_code in (401, 403, 404, 410):
        raise _http_error(source, resp)
    length = resp.headers.get("Content-Length")
    return int(length) if resp.ok and length else None


def _http_error(url: str, resp: requests.Response) -> PipelineError:
    return PipelineError(
        f"{redact(url)}: expected the archive, found HTTP {resp.status_code} ({resp.reason}). "
        "Check download.source / the per-archive URL in params.yaml, and, if the server needs credentials, "
        "~/.netrc (`machine <host> login <user> password <secret>`; params.yaml refuses them in the URL)."
    )


@contextlib.contextmanager
def _fsspec_errors(url: str) -> Iterator[None]:
    """Turn a missing object or refused access into a PipelineError that says what to do."""
    try:
        yield
    except FileNotFoundError:
        raise PipelineError(
            f"{redact(url)}: expected the archive, found nothing there. Check "
            "download.source / the per-archive URL in params.yaml."
        ) from None
    except PermissionError as err:
        raise PipelineError(
            f"{redact(url)}: expected read access, found 'access denied' ({err}). Provide "
            "credentials through the environment (e.g. AWS_ACCESS_KEY_ID / AWS_PROFILE, "
            "AWS_ENDPOINT_URL) or the fsspec config (FSSPEC_S3_* variables)."
        ) from None


def _fsspec_size(url: str) -> int:
    import fsspec  # (only for an fsspec URL: ~90 ms to import, an http(s) or local source never needs it)

    with _fsspec_errors(url):
        fs, path = fsspec.core.url_to_fs(url)
        return int(fs.size(path))


# ---------------------------------------------------------------- one request
Stream = tuple[int, "int | None", Iterator[bytes], Any]  # (start offset, total size, chunks, closable)


def _raw_chunks(resp: requests.Response, size: int) -> Iterator[bytes]:
    """The body exactly as sent (no Content-Encoding decoding: a .tar.gz stays gzip), in pieces of at most
    `size` bytes, each handed over as soon as it arrives — a dropped connection loses nothing received."""
    try:
        while block := resp.raw.read1(size, decode_content=False):
            yield block
    except urllib3.exceptions.HTTPError as err:
        raise Transient(reason(err)) from None


def reason(err: BaseException) -> str:
    """A failed attempt in a few words: urllib3 and requests nest the cause several levels deep, repeating the
    URL and the object reprs (`ProtocolError('Connection broken: IncompleteRead(...)', IncompleteRead(...))`)."""
    if isinstance(err, Transient):
        return str(err)
    root, seen = err, 0
    while seen < 8:  # the innermost exception: MaxRetryError.reason, ProtocolError's second arg, __cause__
        nested = getattr(root, "reason", None) or next((a for a in root.args if isinstance(a, BaseException)), None)
        nested = nested if isinstance(nested, BaseException) else root.__cause__ or root.__context__
        if nested is None or nested is root:
            break
        root, seen = nested, seen + 1
    what = {"ProtocolError": "connection broken", "ReadTimeoutError": "read timed out"}.get(
        type(err).__name__, type(err).__name__
    )
    detail = root.strerror if isinstance(root, OSError) and root.strerror else type(root).__name__
    return what if root is err else f"{what} ({detail})"


def http_stream(url: str, offset: int, opts: FetchOptions) -> Stream:
    headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={offset}-"} if offset else {})}
    resp = requests.get(url, headers=headers, stream=True, timeout=(opts.timeout_s, opts.timeout_s))
    code = resp.status_code
    if code == 416 and offset:  # the .part already holds every byte
        total = resp.headers.get("Content-Range", "").rpartition("/")[2]
        resp.close()
        if total.isdigit() and int(total) == offset:
            return offset, offset, iter(()), resp
        raise Transient(f"HTTP 416 for bytes={offset}- (server size {total or 'unknown'})")
    if code >= 500 or code in (408, 429):
        resp.close()
        raise Transient(f"HTTP {code}")
    if code >= 400:
        resp.close()
        raise _http_error(url, resp)
    if code == 206:
        span, _, total = resp.headers.get("Content-Range", "").partition("/")
        start = int(span.split()[-1].split("-")[0])
        return start, int(total) if total.isdigit() else None, _raw_chunks(resp, opts.chunk_bytes), resp
    length = resp.headers.get("Content-Length")
    return 0, int(length) if length else None, _raw_chunks(resp, opts.chunk_bytes), resp


def fsspec_stream(url: str, offset: int, opts: FetchOptions) -> Stream:
    import fsspec  # (only for an fsspec URL, as in _fsspec_size)

    with _fsspec_errors(url):
        fs, path = fsspec.core.url_to_fs(url)
        total = int(fs.size(path))
        fh = fs.open(path, "rb", block_size=opts.chunk_bytes)
    fh.seek(offset)
    return offset, total, iter(lambda: fh.read(opts.chunk_bytes), b""), fh
