"""convert stage: manifests + label map -> Parquet shards per split (`python -m flows.convert`, run by dvc.yaml).

One Prefect task per shard, on the task runner `convert.task_runner` names (tasks.convert.distribute): `local`
threads each handing its shard to a pool of `convert.workers` processes (which never talk to the Prefect API),
or `dask` (`prefect_dask.DaskTaskRunner` on the existing scheduler at `convert.dask_address`). Tasks receive paths
and row ranges (a `Job` and a `ShardPlan`), never image bytes."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from flows.cli import main
from imagenet_parquet.format import FormatError
from tasks.common.params import load_project
from tasks.convert import distribute
from tasks.convert import stage as convert
from tasks.convert.distribute import Distribution
from tasks.convert.job import job_from_params

plan_shards = task(name="plan-shards", cache_policy=NO_CACHE)(convert.prepare)
convert_shard = task(name="convert-shard", task_run_name="{plan.split}-{plan.index:05d}", cache_policy=NO_CACHE)(
    distribute.convert_in_pool
)
finalize = task(name="bad-images-and-metrics", cache_policy=NO_CACHE)(convert.finalize)


@flow(name="convert")
def convert_flow(params_file: str = "params.yaml") -> dict[str, Any]:
    """Plan shards, convert them on the flow's task runner (resuming finished ones), then write the metrics."""
    project = load_project(params_file)
    job = job_from_params(project.params.convert, project.paths, project.root)
    started = time.perf_counter()
    plans = plan_shards(job)
    progress = convert.Progress(plans)
    with distribute.local_pool(Distribution.from_params(project.params.convert), plans):
        futures = [convert_shard.submit(job, plan) for plan in plans]
        results = [progress.update(future.result()) for future in as_completed(futures)]
    progress.close()
    return finalize(job, plans, results, time.perf_counter() - started)


def task_runner(dist: Distribution) -> TaskRunner[Any]:
    """Threads of this process (local: each hands its shard to the process pool), or an existing Dask scheduler."""
    if dist.runner == "dask":
        from prefect_dask.task_runners import DaskTaskRunner

        return DaskTaskRunner(address=dist.address)
    return ThreadPoolTaskRunner(max_workers=dist.workers)


def run(params_file: str = "params.yaml") -> dict[str, Any]:
    """The stage command: convert_flow on the task runner chosen in params."""
    dist = Distribution.from_params(load_project(params_file).params.convert)
    result: dict[str, Any] = convert_flow.with_options(task_runner=task_runner(dist))(params_file=params_file)
    return result


if __name__ == "__main__":
    main(run, user_errors=(FormatError,))
