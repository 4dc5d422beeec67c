"""convert stage: manifests + label map -> Parquet shards per split (`python -m flows.convert`, run by dvc.yaml).

Shards fan out as Prefect tasks on the task runner named by `convert.task_runner`:
- `local`: a `ThreadPoolTaskRunner` of `convert.workers` threads, each handing its shard to a process pool of as
  many worker processes (CPU-bound work in processes; the worker processes never talk to the Prefect API, so no
  per-process Prefect client or temporary server is started when no `PREFECT_API_URL` is set);
- `dask`: `prefect_dask.DaskTaskRunner` on the existing scheduler at `convert.dask_address`.
Tasks receive paths and row ranges (a `Job` and a `ShardPlan`), never image bytes."""
from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from flows.cli import main
from imagenet_parquet.format import FormatError
from tasks.convert import stage as convert
from tasks.common.params import load_params, paths
from tasks.convert.job import Job, job_from_params, runner_params
from tasks.convert.plan import ShardPlan

_POOL: list[Executor] = []  # the local runner's process pool while a flow runs (tasks are threads of this process)


def _convert_in_process(job: Job, plan: ShardPlan) -> dict[str, Any]:
    """Local runner task body: hand the shard to a worker process and wait for its stats."""
    return _POOL[-1].submit(convert.convert_shard, job, plan).result()


plan_shards = task(convert.prepare, name="plan-shards", cache_policy=NO_CACHE)
shard_here = task(convert.convert_shard, name="convert-shard", task_run_name="{plan.split}-{plan.index:05d}",
                  cache_policy=NO_CACHE)
shard_in_process = task(_convert_in_process, name="convert-shard", task_run_name="{plan.split}-{plan.index:05d}",
                        cache_policy=NO_CACHE)
finalize = task(convert.finalize, name="bad-images-and-metrics", cache_policy=NO_CACHE)


@flow(name="convert")
def convert_flow(params_file: str = "params.yaml") -> dict[str, Any]:
    """Plan shards, convert them on the flow's task runner (resuming finished ones), then write the metrics.

    Paths in params.yaml are relative to the directory of `params_file` (the repo)."""
    cfg = load_params("convert", params_file)
    job = job_from_params(cfg, paths(params_file), root=Path(params_file).resolve().parent)
    kind, workers, _ = runner_params(cfg)
    started = time.perf_counter()
    plans = plan_shards(job)
    progress = convert.Progress(plans)
    with _process_pool(workers if kind == "local" else 0):
        shard_task = shard_in_process if kind == "local" else shard_here
        futures = [shard_task.submit(job, plan) for plan in plans]
        results = [progress.update(future.result()) for future in as_completed(futures)]
    progress.close()
    return finalize(job, plans, results, time.perf_counter() - started)


@contextlib.contextmanager
def _process_pool(workers: int) -> Iterator[None]:
    if not workers:
        yield
        return
    # forkserver: workers fork from a clean server process, not from this threaded flow process
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver")) as pool:
        _POOL.append(pool)
        try:
            yield
        finally:
            _POOL.remove(pool)


def task_runner(cfg: dict[str, Any]) -> TaskRunner:
    """The task runner named by params.yaml `convert:` (local threads + processes, or an existing Dask scheduler)."""
    kind, workers, address = runner_params(cfg)
    if kind == "dask":
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(address=address)
    return ThreadPoolTaskRunner(max_workers=workers)


def run(params_file: str = "params.yaml") -> dict[str, Any]:
    """The stage command: convert_flow on the task runner chosen in params."""
    runner = task_runner(load_params("convert", params_file))
    return convert_flow.with_options(task_runner=runner)(params_file=params_file)


if __name__ == "__main__":
    main(run, user_errors=(FormatError,))
