"""Progress of a long step (MD5, tar scan, convert, validate), readable at a terminal and in CI logs.

At a terminal it is a tqdm bar. Without one (CI, `dvc repro > log`), tqdm's carriage-return redraws are unreadable
or empty, so a plain line is printed every `every_s` seconds (`IMAGENET_PARQUET_PROGRESS_S`, default 5) and one
at the end when any was printed:

    md5 ILSVRC2012_img_train.tar: 41.2 GB / 147.9 GB (27.9 %), 512 MB/s, ETA 3 min 28 s
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

from tqdm import tqdm

EVERY_ENV = "IMAGENET_PARQUET_PROGRESS_S"


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


class Progress:
    """`with Progress(total, "md5 x.tar") as bar: bar.update(n)`; `enabled=False` shows nothing."""

    def __init__(
        self,
        total: float,
        desc: str,
        unit: str = "B",
        enabled: bool = True,
        stream: IO[str] | None = None,
        every_s: float | None = None,
    ) -> None:
        self.total, self.desc, self.unit, self.done = total, desc, unit, 0.0
        self.stream = stream or sys.stderr
        self.every = _every() if every_s is None else every_s
        self.started = self.last = time.monotonic()
        self.printed = False
        self.bar: Any = None
        self.enabled = enabled
        if enabled and _is_terminal(self.stream):
            binary = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {"unit_scale": True}
            self.bar = tqdm(
                total=total, desc=desc, unit=unit, file=self.stream, leave=False, dynamic_ncols=True, **binary
            )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float, postfix: str | None = None) -> None:
        self.done += n
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(n)
        elif self.enabled and time.monotonic() - self.last >= self.every:
            self._line(postfix)

    def _line(self, postfix: str | None) -> None:
        now = time.monotonic()
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        parts = [f"{_amount(self.done, self.unit)} / {_amount(self.total, self.unit)}"]
        if self.total:
            parts[0] += f" ({100 * self.done / self.total:.1f} %)"
        parts.append(f"{_amount(rate, self.unit, digits=1)}/s")
        if rate > 0 and self.total > self.done:
            parts.append(f"ETA {_duration((self.total - self.done) / rate)}")
        if postfix:
            parts.append(postfix)
        print(f"{self.desc}: {', '.join(parts)}", file=self.stream, flush=True)
        self.last, self.printed = now, True

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.printed:
            elapsed = time.monotonic() - self.started
            print(
                f"{self.desc}: done, {_amount(self.done, self.unit)} in {_duration(elapsed)}",
                file=self.stream,
                flush=True,
            )
            self.printed = False


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
