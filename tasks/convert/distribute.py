"""Where shards are converted: local worker processes, or the workers of an existing Dask cluster.

`Distribution` is the choice made in params.yaml (`convert.task_runner`, `workers`, `dask_address`); it never
changes the bytes written. In a Prefect flow the `local` runner is a thread per shard handing the shard to a
process pool of `workers` processes (`local_pool`), so the worker processes never talk to the Prefect API; the
`dask` runner runs `convert_shard` on the Dask workers themselves. `run_local` is the whole stage without Prefect
(library use, benchmarks): call it under `if __name__ == "__main__":` in a script (worker processes re-import it;
without the guard the pool breaks, reported as a PipelineError saying so).

The pool's processes die with the stage (`tasks.common.procs.exit_with` in each worker), so a `kill -9` of the
stage command leaves no worker converting a shard nobody will collect."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from tasks.common import PipelineError
from tasks.common.params import ConvertParams
from tasks.common.procs import exit_with
from tasks.convert.job import Job
from tasks.convert.plan import ShardPlan
from tasks.convert.stage import Progress, convert_shard, finalize, prepare

_POOLS: list[Executor] = []  # the local pool while a flow runs (its tasks are threads of this process)


@dataclass(frozen=True)
class Distribution:
    """How shards are spread: `runner` local (processes of this machine) or dask (an existing scheduler)."""

    runner: str = "local"
    workers: int = 1
    address: str | None = None

    @classmethod
    def from_params(cls, params: ConvertParams) -> Distribution:
        return cls(params.task_runner, params.workers, params.dask_address)


def process_pool(workers: int) -> ProcessPoolExecutor:
    """`workers` processes forked from a clean forkserver (not from a caller that may hold threads or locks); each
    worker ends as soon as this process does (the forkserver and resource tracker follow once the workers are gone)."""
    context = multiprocessing.get_context("forkserver")
    return ProcessPoolExecutor(workers, mp_context=context, initializer=exit_with, initargs=(os.getpid(),))


POOL_MIN_IMAGES = 2_000  # below, a pool costs more than it saves: each worker starts and imports (~1.2 CPU-s)


@contextlib.contextmanager
def local_pool(dist: Distribution, plans: list[ShardPlan]) -> Iterator[None]:
    """While the block runs, `convert_in_pool` hands shards to a pool of `dist.workers` processes (local runner);
    none when it could not run two of the `plans` at once (one worker, one shard) or they hold fewer than
    POOL_MIN_IMAGES images (a small append: ~1 CPU-s of conversion per 400 images at ImageNet's sizes, against the
    workers' start), the shards are then converted in this process."""
    images = sum(p.stop - p.start for p in plans)
    if dist.runner != "local" or min(dist.workers, len(plans)) < 2 or images < POOL_MIN_IMAGES:
        yield
        return
    with process_pool(dist.workers) as pool:
        _POOLS.append(pool)
        try:
            yield
        finally:
            _POOLS.remove(pool)


def convert_in_pool(job: Job, plan: ShardPlan) -> dict[str, Any]:
    """One shard: in the local pool when one is open (local runner), else in this process (a Dask worker)."""
    if _POOLS:
        return pool_result(_POOLS[-1].submit(convert_shard, job, plan))
    return convert_shard(job, plan)


def pool_result(future: Future[dict[str, Any]]) -> dict[str, Any]:
    """A shard's result; a pool that broke (a worker died) is explained instead of a bare BrokenProcessPool."""
    try:
        return future.result()
    except BrokenProcessPool:
        raise PipelineError(
            "convert: expected the worker processes to convert the shards, found that one died abruptly "
            '(BrokenProcessPool). Called from your own script? Put the call under `if __name__ == "__main__":` '
            "(each worker imports the script: unguarded, it starts the conversion again inside the worker), or "
            "use workers=1. Otherwise a worker was killed (out of memory: see `dmesg`; lower convert.workers) — "
            "run again: finished shards are kept."
        ) from None


def run_local(job: Job, workers: int = 1, progress: bool = True, pool: Executor | None = None) -> dict[str, Any]:
    """The whole stage without Prefect: shards over `workers` processes (1 = in this process), or on `pool`."""
    started = time.perf_counter()
    plans = prepare(job)
    bar = Progress(plans, enabled=progress)
    if pool is None and workers <= 1:
        results = [bar.update(convert_shard(job, plan)) for plan in plans]
    else:
        own = pool or process_pool(workers)
        try:
            futures = [own.submit(convert_shard, job, plan) for plan in plans]
            results = [bar.update(pool_result(f)) for f in as_completed(futures)]
        finally:
            if pool is None:
                own.shutdown()
    bar.close()
    return finalize(job, plans, results, time.perf_counter() - started)
