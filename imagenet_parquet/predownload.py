"""Predownload: the row groups a DataLoader worker reads next, fetched into the node cache ahead of it in a
background thread (MosaicML streaming's `predownload`), so a remote read rarely waits on the network.

The worker's row groups are known for the whole epoch (its positions of the epoch order): `Predownload` fetches
them in order of first use, at most `depth` row groups past the one the worker is reading now (`reading`). It only
ever warms the cache — every byte goes through the cache's fill and checks, as a read does — so a failed fetch
stops it quietly: the worker's own read then fetches, retries and reports the error, naming the URL."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence


class Predownload:
    """`fetch(unit)` for `units` (in order of first use), in a daemon thread, up to `depth` ahead of `reading`."""

    def __init__(self, units: Sequence[int], fetch: Callable[[int], None], depth: int):
        self.units = list(dict.fromkeys(int(u) for u in units))
        self._at = {u: i for i, u in enumerate(self.units)}
        self._fetch, self._depth = fetch, depth
        self._reading, self._stopped = 0, False
        self._changed = threading.Condition()
        self.fetched = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def reading(self, unit: int) -> None:
        """The worker is reading row group `unit` now."""
        with self._changed:
            self._reading = max(self._reading, self._at.get(int(unit), self._reading))
            self._changed.notify()

    def close(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()
        self._thread.join()

    def _run(self) -> None:
        for i, unit in enumerate(self.units):
            with self._changed:
                self._changed.wait_for(lambda i=i: self._stopped or i <= self._reading + self._depth)  # type: ignore[misc]
                if self._stopped:
                    return
            try:
                self._fetch(unit)
            except Exception:  # the worker's own read of it fetches again and reports what went wrong
                return
            self.fetched += 1
