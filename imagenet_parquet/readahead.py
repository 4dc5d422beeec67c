"""A bounded background reader: loads the next items of a known order in a thread while the caller decodes.

Arrow's row-group reads (and the remote fetches) release the GIL, so the read of row group k+1 overlaps the
decoding of row group k; `hint` (POSIX_FADV_WILLNEED on local files) lets the kernel start on the ones after.
Memory: at most `depth` loaded items wait in the queue, plus the one being loaded and the one being consumed."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")
_DONE, _ITEM, _ERROR = 0, 1, 2


def read_ahead(
    keys: Sequence[K],
    load: Callable[[K], V],
    depth: int = 2,
    hint: Callable[[Sequence[K]], None] | None = None,
    hint_ahead: int = 4,
) -> Iterator[V]:
    """`load(k)` for every key in order, computed up to `depth` items ahead in a daemon thread.

    `hint(keys)` is called for the keys up to `hint_ahead` past the one being loaded (each key once). `depth=0`
    loads synchronously in the caller's thread (hints still given). An exception in `load` is raised in the
    caller at that item; closing the iterator early stops the thread."""
    if depth < 0 or hint_ahead < 0:
        raise ValueError(f"depth, hint_ahead: expected >= 0, found {depth}, {hint_ahead}")
    hinted = _Hints(keys, hint, hint_ahead)
    if depth == 0:
        for i, key in enumerate(keys):
            hinted.upto(i)
            yield load(key)
        return
    results: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    thread = threading.Thread(target=_produce, args=(keys, load, hinted, results, stop), daemon=True)
    thread.start()
    try:
        while True:
            kind, value = results.get()
            if kind == _DONE:
                return
            if kind == _ERROR:
                raise value
            yield value
    finally:
        stop.set()
        thread.join()


class _Hints:
    def __init__(self, keys: Sequence[Any], hint: Callable[[Sequence[Any]], None] | None, ahead: int):
        self.keys, self.hint, self.ahead, self.done = keys, hint, ahead, 0

    def upto(self, i: int) -> None:
        end = min(len(self.keys), i + 1 + self.ahead)
        if self.hint is not None and end > self.done:
            self.hint(self.keys[self.done : end])
            self.done = end


def _produce(
    keys: Sequence[Any],
    load: Callable[[Any], Any],
    hints: _Hints,
    out: queue.Queue[tuple[int, Any]],
    stop: threading.Event,
) -> None:
    try:
        for i, key in enumerate(keys):
            hints.upto(i)
            if not _put(out, (_ITEM, load(key)), stop):
                return
    except BaseException as err:  # handed to the consumer, raised there
        _put(out, (_ERROR, err), stop)
        return
    _put(out, (_DONE, None), stop)


def _put(out: queue.Queue[tuple[int, Any]], item: tuple[int, Any], stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            out.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False
