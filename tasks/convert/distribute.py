"""Where shards are converted: local worker processes, or the workers of an existing Dask cluster.

`Distribution` is the choice made in params.yaml (`convert.task_runner`, `workers`, `dask_address`); it never
changes the bytes written. In a Prefect flow the `local` runner is a thread per shard handing the shard to a
process pool of `workers` processes (`local_pool`), so the worker processes never talk to the Prefect API; the
`dask` runner runs `convert_shard` on the Dask workers themselves. `run_local` is the whole stage without Prefect
(library use, benchmarks): call it under `if __name__ == "__main__":` in a script (worker processes re-import it)."""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from tasks.common.params import ConvertParams
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
    """`workers` processes forked from a clean forkserver (not from a caller that may hold threads or locks)."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"))


@contextlib.contextmanager
def local_pool(dist: Distribution) -> Iterator[None]:
    """While the block runs, `convert_in_pool` hands shards to a pool of `dist.workers` processes (local runner)."""
    if dist.runner != "local":
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
        return _POOLS[-1].submit(convert_shard, job, plan).result()
    return convert_shard(job, plan)


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
            results = [bar.update(f.result()) for f in as_completed(futures)]
        finally:
            if pool is None:
                own.shutdown()
    bar.close()
    return finalize(job, plans, results, time.perf_counter() - started)
