"""Convert's reads of the image bytes: pread through the manifest's (source, offset, size), one source open at a
time, each row group read in archive-offset order with the next ~PREFETCH_BYTES asked of the kernel ahead."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tasks.common import PipelineError

PREFETCH_BYTES = 32 << 20  # image bytes asked of the kernel ahead of the encoder (page cache, no memory here)


class Sources:
    """Open source files (relative to the repo root), one at a time: archives are read by many rows in a row.

    The kernel's own readahead is off (POSIX_FADV_RANDOM): in hashed order a shard's images lie all over the
    archive, and every byte read is asked for exactly (WILLNEED) a group ahead, so nothing is read twice."""

    def __init__(self, root: Path) -> None:
        self.root, self.fd = root, -1
        self.path: str | None = None  # the source `fd` has open

    def __enter__(self) -> Sources:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def groups(self, rows: list[dict[str, Any]], size: int) -> Iterator[tuple[list[dict[str, Any]], list[bytes]]]:
        """`rows` in groups of `size` with their image bytes; each group is read in (source, offset) order — one
        forward sweep over the archive — while the kernel fetches the next ~PREFETCH_BYTES of that read order."""
        size = max(1, size)
        starts = range(0, len(rows), size)
        sequence = [
            j for k in starts for j in sorted(range(k, min(k + size, len(rows))), key=lambda j: _disk_order(rows[j]))
        ]
        data: dict[int, bytes] = {}
        ahead = mark = 0  # sequence[:ahead] asked of the kernel; ask for more once sequence[mark] is read
        for n, j in enumerate(sequence):
            data[j] = self.read(rows[j]["source"], rows[j]["offset"], rows[j]["size"])
            if n >= mark:  # keep ~PREFETCH_BYTES of the next images on their way from disk while these encode
                ahead = self._prefetch(rows, sequence, max(ahead, n + 1))
                mark = (n + ahead) // 2
            if (n + 1) % size == 0 or n + 1 == len(sequence):
                first = n // size * size
                yield rows[first : first + size], [data.pop(i) for i in range(first, min(first + size, len(rows)))]

    def read(self, source: str, offset: int, size: int) -> bytes:
        self._open(source)
        return read_exact(self.fd, size, offset, source)

    def _open(self, source: str) -> None:
        if source == self.path:
            return
        self.__exit__()
        try:
            self.fd = os.open(self.root / source, os.O_RDONLY)
        except OSError as err:
            raise PipelineError(
                f"{source}: expected the file named by the manifest, found {err.strerror}; "
                "re-run `dvc repro` (download, verify, extract)"
            ) from None
        self.path = source
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)

    def _prefetch(self, rows: list[dict[str, Any]], sequence: list[int], start: int) -> int:
        """posix_fadvise(WILLNEED) for rows[sequence[start:]] of the open source, up to PREFETCH_BYTES; the first
        position not asked for (folder mode, one file per row: nothing is asked, the kernel reads small files
        whole)."""
        end, asked = start, 0
        while end < len(sequence) and asked < PREFETCH_BYTES and rows[sequence[end]]["source"] == self.path:
            row = rows[sequence[end]]
            os.posix_fadvise(self.fd, row["offset"], row["size"], os.POSIX_FADV_WILLNEED)
            asked += row["size"]
            end += 1
        return end


def _disk_order(row: dict[str, Any]) -> tuple[str, int]:
    return row["source"], row["offset"]


def read_exact(fd: int, size: int, offset: int, source: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise PipelineError(
            f"{source}: expected {size} bytes at offset {offset} (from the manifest), found {len(data)}; the "
            "archive changed after extraction — re-run `dvc repro` from the verify stage"
        )
    return data
