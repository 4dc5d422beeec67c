"""The benchmarks' quiet-machine gate (benchmarks/common.py): it waits for the load to fall under its limit, and
says so above the tables; when the machine stays busy past the wait it says that instead."""

from __future__ import annotations

import itertools

import pytest

from benchmarks import common


def test_the_gate_waits_for_a_quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    limit = common.QUIET_LOAD_PER_CPU * len(common.os.sched_getaffinity(0))
    loads = itertools.chain([limit * 8, limit * 4], itertools.repeat(limit / 2))
    monkeypatch.setattr(common.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    slept: list[float] = []
    monkeypatch.setattr(common.time, "sleep", slept.append)
    line = common.quiet_gate(wait_s=60)
    assert line.startswith("machine quiet: load ") and slept == [5, 5], (line, slept)


def test_a_machine_that_stays_busy_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    limit = common.QUIET_LOAD_PER_CPU * len(common.os.sched_getaffinity(0))
    monkeypatch.setattr(common.os, "getloadavg", lambda: (limit * 8, 0.0, 0.0))
    clock = itertools.count(0, 30)
    monkeypatch.setattr(common.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(common.time, "sleep", lambda s: None)
    line = common.quiet_gate(wait_s=60)
    assert line.startswith("machine busy: load ") and "after waiting 60 s" in line, line
