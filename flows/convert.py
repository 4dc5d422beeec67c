"""convert stage: manifests + label map -> Parquet shards per split (`python -m flows.convert`, run by dvc.yaml).

Shards fan out as Prefect tasks on the configured task runner (`convert.task_runner`): `local` = a process pool
of `convert.workers` processes, `dask` = prefect-dask's DaskTaskRunner on the scheduler at `convert.dask_address`.
Tasks receive paths and row ranges (a `Job` and a `ShardPlan`), never image bytes."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner

from flows.cli import main
from tasks import convert
from tasks.common import load_params, paths
from tasks.convert_params import job_from_params, runner_params

plan_shards = task(convert.prepare, name="plan-shards", cache_policy=NO_CACHE)
convert_shard = task(convert.convert_shard, name="convert-shard", task_run_name="{plan.split}-{plan.index:05d}",
                     cache_policy=NO_CACHE)
finalize = task(convert.finalize, name="bad-images-and-metrics", cache_policy=NO_CACHE)


@flow(name="convert")
def convert_flow(params_file: str = "params.yaml") -> dict[str, Any]:
    """Plan shards, convert them on the flow's task runner (resuming finished ones), then write the metrics.

    Paths in params.yaml are relative to the directory of `params_file` (the repo)."""
    root = Path(params_file).resolve().parent
    job = job_from_params(load_params("convert", params_file), paths(params_file), root=root)
    started = time.perf_counter()
    plans = plan_shards(job)
    progress = convert.Progress(plans)
    futures = [convert_shard.submit(job, plan) for plan in plans]
    results = [progress.update(future.result()) for future in as_completed(futures)]
    progress.close()
    return finalize(job, plans, results, time.perf_counter() - started)


def task_runner(cfg: dict[str, Any]) -> TaskRunner:
    """The task runner named by params.yaml `convert:` (local process pool, or an existing Dask scheduler)."""
    kind, workers, address = runner_params(cfg)
    if kind == "dask":
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(address=address)
    return ProcessPoolTaskRunner(max_workers=workers)


def run(params_file: str = "params.yaml") -> dict[str, Any]:
    """The stage command: convert_flow on the task runner chosen in params."""
    runner = task_runner(load_params("convert", params_file))
    return convert_flow.with_options(task_runner=runner)(params_file=params_file)


if __name__ == "__main__":
    main(run)
