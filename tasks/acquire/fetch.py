"""Resumable streaming of one network archive (http(s):// with Range, or any fsspec URL such as s3://).

Bytes go to `<dest>.part`, are hashed (MD5) while they arrive and the file is renamed onto `dest` only when
complete. A dropped connection, a 5xx, a stall past the timeout or a short body is retried with exponential
backoff (bounded), resuming from what `.part` holds; a 4xx or a write failure is not retried. A body is short when
it holds fewer bytes than the response announced or, when it announced nothing (no Content-Length), than HEAD
said before. Each failed attempt is one log line (reason, byte reached, retry n/m, delay). Credentials come from
~/.netrc, the environment or the fsspec config (params.yaml refuses user info in a URL; a URL given in code is
redacted wherever a source is shown)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
import urllib3
from tqdm import tqdm

from tasks.common import PipelineError
from tasks.common.archive_pass import StreamIndex
from tasks.common.params import DownloadParams

log = logging.getLogger(__name__)


class RetryableError(PipelineError):
    """The network gave up on us after every retry; a re-run resumes from the `.part` file."""


class _Transient(Exception):
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
    import fsspec

    with _fsspec_errors(url):
        fs, path = fsspec.core.url_to_fs(url)
        return int(fs.size(path))


# ---------------------------------------------------------------- resumable streaming
Stream = tuple[int, "int | None", Iterator[bytes], Any]  # (start offset, total size, chunks, closable)


def _raw_chunks(resp: requests.Response, size: int) -> Iterator[bytes]:
    """The body exactly as sent (no Content-Encoding decoding: a .tar.gz stays gzip), in pieces of at most
    `size` bytes, each handed over as soon as it arrives — a dropped connection loses nothing received."""
    try:
        while block := resp.raw.read1(size, decode_content=False):
            yield block
    except urllib3.exceptions.HTTPError as err:
        raise _Transient(_reason(err)) from None


def _reason(err: BaseException) -> str:
    """A failed attempt in a few words: urllib3 and requests nest the cause several levels deep, repeating the
    URL and the object reprs (`ProtocolError('Connection broken: IncompleteRead(...)', IncompleteRead(...))`)."""
    if isinstance(err, _Transient):
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


def _http_stream(url: str, offset: int, opts: FetchOptions) -> Stream:
    headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={offset}-"} if offset else {})}
    resp = requests.get(url, headers=headers, stream=True, timeout=(opts.timeout_s, opts.timeout_s))
    code = resp.status_code
    if code == 416 and offset:  # the .part already holds every byte
        total = resp.headers.get("Content-Range", "").rpartition("/")[2]
        resp.close()
        if total.isdigit() and int(total) == offset:
            return offset, offset, iter(()), resp
        raise _Transient(f"HTTP 416 for bytes={offset}- (server size {total or 'unknown'})")
    if code >= 500 or code in (408, 429):
        resp.close()
        raise _Transient(f"HTTP {code}")
    if code >= 400:
        resp.close()
        raise _http_error(url, resp)
    if code == 206:
        span, _, total = resp.headers.get("Content-Range", "").partition("/")
        start = int(span.split()[-1].split("-")[0])
        return start, int(total) if total.isdigit() else None, _raw_chunks(resp, opts.chunk_bytes), resp
    length = resp.headers.get("Content-Length")
    return 0, int(length) if length else None, _raw_chunks(resp, opts.chunk_bytes), resp


def _fsspec_stream(url: str, offset: int, opts: FetchOptions) -> Stream:
    import fsspec

    with _fsspec_errors(url):
        fs, path = fsspec.core.url_to_fs(url)
        total = int(fs.size(path))
        fh = fs.open(path, "rb", block_size=opts.chunk_bytes)
    fh.seek(offset)
    return offset, total, iter(lambda: fh.read(opts.chunk_bytes), b""), fh


def part_path(dest: Path) -> Path:
    """Where the bytes of `dest` collect until the download is complete."""
    return dest.with_name(dest.name + ".part")


class _Held:
    """What `.part` holds so far: its size and the running MD5 of exactly those bytes."""

    def __init__(self, part: Path, chunk: int, index: StreamIndex | None = None) -> None:
        self.part, self.digest, self.size, self.index = part, hashlib.md5(), 0, index
        if part.exists():  # left by an earlier, interrupted run: hash it once to continue the MD5 (and the index)
            with open(part, "rb") as fh:
                while block := fh.read(chunk):
                    self.digest.update(block)
                    self.add(block)

    def add(self, block: bytes) -> None:
        """`block` was appended to `.part` (and hashed): count it, and hand it to the tar index being made."""
        self.size += len(block)
        if self.index is not None:
            self.index.feed(block)

    def restart(self) -> None:
        self.digest, self.size = hashlib.md5(), 0
        if self.index is not None:  # the bytes fed so far are not the file's start any more
            self.index.abort()
            self.index = None


def _write_error(part: Path, err: OSError) -> PipelineError:
    part.unlink(missing_ok=True)
    return PipelineError(
        f"{part}: expected to write the download here, found {err.strerror or err} "
        f"(errno {err.errno}). Make {part.parent} writable and give it enough free space, "
        "or point paths.raw elsewhere; nothing was left behind."
    )


def _append(fh: Any, block: bytes, part: Path) -> None:
    view = memoryview(block)
    try:
        while view:
            view = view[fh.write(view) :]
    except OSError as err:
        fh.close()
        raise _write_error(part, err) from None


class _BackgroundMd5:
    """Feeds blocks to an MD5 on a second thread (hashlib, file and socket I/O release the GIL), so hashing
    overlaps receiving and writing; on exit every block handed over has been hashed."""

    def __init__(self, digest: Any) -> None:
        self.digest = digest
        self.blocks: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while (block := self.blocks.get()) is not None:
            self.digest.update(block)

    def __enter__(self) -> _BackgroundMd5:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.blocks.put(None)
        self.thread.join()


def _open_part(held: _Held) -> io.FileIO:
    """`.part` opened to append what arrives (anew when it holds nothing), unbuffered."""
    try:
        return open(held.part, "ab" if held.size else "wb", buffering=0)
    except OSError as err:
        raise _write_error(held.part, err) from None


def _attempt(open_stream: Callable[[int], Stream], held: _Held, bar: tqdm, expected: int | None = None) -> None:
    """One request: append what arrives to `.part` (unbuffered, so a write error surfaces at once). `expected`
    (HEAD's size) stands in when the response does not say how many bytes it holds."""
    start, total, chunks, closable = open_stream(held.size)
    total = expected if total is None else total
    with closable:
        if start != held.size:  # the server ignored Range: start over
            held.restart()
            bar.reset(total)
        if total is not None and bar.total != total:  # known size: the bar shows percent and ETA
            bar.total = total
            bar.refresh()
        with _open_part(held) as fh, _BackgroundMd5(held.digest) as md5:
            for block in chunks:
                _append(fh, block, held.part)
                md5.blocks.put(block)
                held.add(block)
                bar.update(len(block))
    if total is not None and held.size < total:
        raise _Transient(f"connection closed after {held.size:,} of {total:,} bytes")


def resumable_download(
    source: str, dest: Path, opts: FetchOptions, index: StreamIndex | None = None, size: int | None = None
) -> tuple[int, str]:
    """Stream `source` into `dest` via `dest.part` (resumed, retried); returns (bytes, md5). Every byte, in file
    order, also goes to `index` (the tar index made on the way in; aborted if the server ignores a Range).
    `size`: remote_size's answer when the caller already asked."""
    opener = _http_stream if kind(source) == "http" else _fsspec_stream
    held = _Held(part_path(dest), opts.chunk_bytes, index)
    expected = size
    if expected is None and opener is _http_stream:  # fsspec always knows the size
        expected = remote_size(source, opts)
    with tqdm(
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        initial=held.size,
        desc=dest.name,
        disable=not opts.progress,
        mininterval=1.0,
    ) as bar:
        for attempt in range(opts.retries + 1):
            try:
                _attempt(lambda offset: opener(source, offset, opts), held, bar, expected)
                break
            except PipelineError:
                raise
            except (_Transient, requests.RequestException, TimeoutError, ConnectionError) as err:
                why = scrub(_reason(err), source)
                if attempt == opts.retries:
                    raise RetryableError(
                        f"{redact(source)}: expected the whole archive, the transfer failed {attempt + 1} times "
                        f"(last: {why}). {held.size} bytes are kept in {held.part}; re-run `dvc repro` to "
                        "resume, or check the network / server."
                    ) from None
                delay = opts.backoff_s * 2**attempt
                log.warning(
                    "%s: %s at byte %s; retry %d/%d in %.1f s",
                    dest.name,
                    why,
                    f"{held.size:,}",
                    attempt + 1,
                    opts.retries,
                    delay,
                )
                time.sleep(delay)
    os.replace(held.part, dest)
    return held.size, held.digest.hexdigest()
