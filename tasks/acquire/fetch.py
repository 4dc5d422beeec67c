"""Resumable streaming of one network archive (http(s):// with Range, or any fsspec URL such as s3://: the
requests themselves are tasks.acquire.remote).

Bytes go to `<dest>.part`, are hashed (MD5) while they arrive and the file is renamed onto `dest` only when
complete. A dropped connection, a 5xx, a stall past the timeout or a short body is retried with exponential
backoff (bounded), resuming from what `.part` holds; a 4xx or a write failure is not retried. A body is short when
it holds fewer bytes than the response announced or, when it announced nothing (no Content-Length), than HEAD
said before. Each failed attempt is one log line (reason, byte reached, retry n/m, delay). Credentials come from
~/.netrc, the environment or the fsspec config (params.yaml refuses user info in a URL; a URL given in code is
redacted wherever a source is shown)."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from tasks.acquire.remote import (
    FetchOptions,
    Stream,
    Transient,
    fsspec_stream,
    http_stream,
    kind,
    reason,
    redact,
    remote_size,
    scrub,
)
from tasks.common import PipelineError
from tasks.common.archive_pass import StreamIndex
from tasks.common.progress import Progress

log = logging.getLogger(__name__)


class RetryableError(PipelineError):
    """The network gave up on us after every retry; a re-run resumes from the `.part` file."""


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


def _attempt(open_stream: Callable[[int], Stream], held: _Held, bar: Progress, expected: int | None = None) -> None:
    """One request: append what arrives to `.part` (unbuffered, so a write error surfaces at once). `expected`
    (HEAD's size) stands in when the response does not say how many bytes it holds."""
    start, total, chunks, closable = open_stream(held.size)
    total = expected if total is None else total
    with closable:
        if start != held.size:  # the server ignored Range: start over
            held.restart()
            bar.set_total(total or 0, restart=True)
        if total is not None and bar.total != total:  # known size: the bar shows percent and ETA
            bar.set_total(total)
        with _open_part(held) as fh, _BackgroundMd5(held.digest) as md5:
            for block in chunks:
                _append(fh, block, held.part)
                md5.blocks.put(block)
                held.add(block)
                bar.update(len(block))
    if total is not None and held.size < total:
        raise Transient(f"connection closed after {held.size:,} of {total:,} bytes")


def resumable_download(
    source: str, dest: Path, opts: FetchOptions, index: StreamIndex | None = None, size: int | None = None
) -> tuple[int, str]:
    """Stream `source` into `dest` via `dest.part` (resumed, retried); returns (bytes, md5). Every byte, in file
    order, also goes to `index` (the tar index made on the way in; aborted if the server ignores a Range).
    `size`: remote_size's answer when the caller already asked."""
    opener = http_stream if kind(source) == "http" else fsspec_stream
    held = _Held(part_path(dest), opts.chunk_bytes, index)
    expected = size
    if expected is None and opener is http_stream:  # fsspec always knows the size
        expected = remote_size(source, opts)
    with Progress(expected or 0, f"download {dest.name}", enabled=opts.progress, initial=held.size) as bar:
        for attempt in range(opts.retries + 1):
            try:
                _attempt(lambda offset: opener(source, offset, opts), held, bar, expected)
                break
            except PipelineError:
                raise
            except (Transient, requests.RequestException, TimeoutError, ConnectionError) as err:
                why = scrub(reason(err), source)
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
