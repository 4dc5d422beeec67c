"""Progress of a long step (MD5, tar scan, convert, validate), readable at a terminal and in CI logs.

At a terminal it is a tqdm bar. Without one (CI, `dvc repro > log`), tqdm's carriage-return redraws are unreadable
or empty, so a plain line is printed every `every_s` seconds (`IMAGENET_PARQUET_PROGRESS_S`, default 5) and one
at the end when any was printed:

    md5 ILSVRC2012_img_train.tar: 41.2 GB / 147.9 GB (27.9 %), 512 MB/s, ETA 3 min 28 s

Inside a Prefect flow or task run, the same figures also go to a progress artifact of that run (key
`progress-<desc as a slug>`, e.g. `progress-md5-ilsvrc2012-img-train-tar`), updated at most every `UI_EVERY_S`
seconds and once at the end. An API error is logged once and ends the updates; it never fails the step.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Callable
from typing import IO, Any
from uuid import UUID

from tqdm import tqdm

EVERY_ENV = "IMAGENET_PARQUET_PROGRESS_S"
UI_EVERY_S = 2.0  # at most one update of the Prefect progress artifact per this many seconds

log = logging.getLogger(__name__)


def _every() -> float:
    try:
        return float(os.environ.get(EVERY_ENV, "5"))
    except ValueError:
        return 5.0


def _amount(value: float, unit: str, digits: int = 0) -> str:
    if unit == "B":
        return str(tqdm.format_sizeof(value, suffix="B", divisor=1000))
    return f"{value:,.{digits}f} {unit}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def artifact_key(desc: str) -> str:
    """The progress artifact's key: `progress-` and `desc` in lowercase letters, digits and dashes."""
    return "progress-" + (re.sub(r"[^a-z0-9]+", "-", desc.lower()).strip("-") or "step")


def _in_prefect_run() -> bool:
    """True inside a Prefect flow or task run (never imports Prefect: a process that has not cannot be in one)."""
    if "prefect.context" not in sys.modules:
        return False
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


class _UiArtifact:
    """The step's progress artifact in the Prefect UI (the run's Artifacts tab), when run inside a flow or task."""

    def __init__(self, desc: str) -> None:
        self.key, self.last = artifact_key(desc), time.monotonic()
        self.id: UUID | None = None
        if _in_prefect_run():
            from prefect.artifacts import create_progress_artifact

            self.id = self._call(lambda: create_progress_artifact(progress=0.0, key=self.key, description=desc))

    def due(self) -> bool:
        return self.id is not None and time.monotonic() - self.last >= UI_EVERY_S

    def send(self, percent: float, text: str) -> None:
        if self.id is None:
            return
        from prefect.artifacts import update_progress_artifact

        artifact, self.last = self.id, time.monotonic()
        self.id = self._call(lambda: update_progress_artifact(artifact, progress=percent, description=text))

    def _call(self, send: Callable[[], object]) -> UUID | None:
        """`send()`'s artifact id; None (no further updates) after logging an API error once."""
        try:
            return UUID(str(send()))
        except Exception as err:  # the UI's progress never fails the step
            log.warning("%s: the Prefect progress artifact is not updated any more (%s)", self.key, err)
            return None


class Progress:
    """`with Progress(total, "md5 x.tar") as bar: bar.update(n)`; `enabled=False` shows nothing. `total` 0: not
    known yet (`set_total` when it is); `initial`: already done before this run (a resumed download)."""

    def __init__(
        self,
        total: float,
        desc: str,
        unit: str = "B",
        enabled: bool = True,
        stream: IO[str] | None = None,
        every_s: float | None = None,
        initial: float = 0.0,
    ) -> None:
        self.total, self.desc, self.unit, self.done, self.initial = total, desc, unit, initial, initial
        self.stream = stream or sys.stderr
        self.every = _every() if every_s is None else every_s
        self.started = self.last = time.monotonic()
        self.printed = False
        self.enabled, self.postfix = enabled, ""
        self.ui = _UiArtifact(desc) if enabled else None
        terminal = enabled and _is_terminal(self.stream)
        self.bar: Any = _tqdm(total, desc, unit, self.stream, initial) if terminal else None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float, postfix: str | None = None) -> None:
        self.done += n
        self.postfix = postfix or self.postfix
        if self.ui is not None and self.ui.due():
            self.ui.send(self.percent(), self.text())
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(n)
        elif self.enabled and time.monotonic() - self.last >= self.every:
            print(self.text(), file=self.stream, flush=True)
            self.last, self.printed = time.monotonic(), True

    def set_total(self, total: float, restart: bool = False) -> None:
        """The total, once known; `restart`: from 0 again (a download the server would not resume)."""
        self.total = total
        if restart:
            self.done = self.initial = 0.0
            self.started = time.monotonic()
        if self.bar is not None:
            if restart:
                self.bar.initial = 0  # tqdm's rate counts from `initial`
                self.bar.reset(total or None)
            else:
                self.bar.total = total or None
            self.bar.refresh()

    def percent(self) -> float:
        return min(100.0, 100 * self.done / self.total) if self.total else 0.0

    def text(self) -> str:
        """The progress line: done / total (percent), rate, ETA, and the latest postfix."""
        rate = (self.done - self.initial) / max(time.monotonic() - self.started, 1e-9)
        parts = [_amount(self.done, self.unit)]
        if self.total:
            parts[0] += f" / {_amount(self.total, self.unit)} ({100 * self.done / self.total:.1f} %)"
        parts.append(f"{_amount(rate, self.unit, digits=1)}/s")
        if rate > 0 and self.total > self.done:
            parts.append(f"ETA {_duration((self.total - self.done) / rate)}")
        if self.postfix:
            parts.append(self.postfix)
        return f"{self.desc}: {', '.join(parts)}"

    def close(self) -> None:
        if self.ui is not None:
            if self.done >= self.total:
                self.ui.send(100.0, self._summary())
            else:  # it stopped early (an error): where
                self.ui.send(self.percent(), self.text())
            self.ui = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.printed:
            print(self._summary(), file=self.stream, flush=True)
            self.printed = False

    def _summary(self) -> str:
        return f"{self.desc}: done, {_amount(self.done, self.unit)} in {_duration(time.monotonic() - self.started)}"


def _tqdm(total: float, desc: str, unit: str, stream: IO[str], initial: float) -> Any:
    scale = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {"unit_scale": True}
    opts = {"initial": initial, "desc": desc, "unit": unit, "file": stream, "leave": False, "dynamic_ncols": True}
    return tqdm(total=total or None, **opts, **scale)


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
