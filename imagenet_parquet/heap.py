"""Freed heap pages handed back to the OS, so that processes forked later (DataLoader workers) do not carry them."""

from __future__ import annotations

import contextlib
import ctypes

import pyarrow as pa


def release_freed_heap() -> None:
    """Hand back to the OS the heap pages freed by a burst of short-lived allocations. Parsing a shard's Parquet
    footer (1.8 MB with its byte index at 1.33 M rows in 20 shards) builds ~10 MB of C++ objects that are freed
    at once but stay in the allocator's arenas: without this, the dataset's main process held ~200 MB more, and every
    DataLoader worker forked from it counted them in its RSS (docs/results/bench-full-count.txt). glibc's
    malloc_trim and Arrow's pool; nothing where malloc_trim is missing (musl, macOS: their allocators return pages
    their own way)."""
    pa.default_memory_pool().release_unused()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
