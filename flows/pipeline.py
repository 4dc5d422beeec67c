"""The end-to-end pipeline as a Prefect deployment: the operator's entry point from the Prefect UI.

A run writes the run form's values into params.yaml, runs `dvc repro` in the project (dvc.lock stays the one
record; unchanged stages are skipped), streams every line of every stage into this flow run's logs, optionally
`dvc push`es, and attaches artifacts: the schema report (Markdown), the metrics (table), the stages that ran or
were skipped (table).

    prefect server start --host 127.0.0.1          # or: make server
    python -m flows.pipeline serve                 # or: make serve  (from the project directory)
"""

import argparse
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE
from prefect.settings import get_current_settings

from tasks.common import PipelineError
from tasks.deploy import runs
from tasks.deploy.dvc_run import DvcRun, dvc_env, lock_drift, lock_entries, run_dvc, stage_names, stage_outcomes
from tasks.deploy.run_form import RunParams, apply_params, params_updates, preflight

FLOW_NAME = "imagenet-parquet"
DEPLOYMENT = "imagenet-pipeline"
ARTIFACT_KEYS = {"report": "schema-report", "metrics": "pipeline-metrics", "stages": "pipeline-stages"}


def _stage_env() -> dict[str, str]:
    """Stage flows started by DVC report to the same Prefect server as this run (when one is configured)."""
    env = dvc_env()
    env.pop("PREFECT__FLOW_RUN_ID", None)  # the stage flows are runs of their own, not this one
    api_url = get_current_settings().api.url
    if api_url:
        env["PREFECT_API_URL"] = str(api_url)
    return env


def _dvc(args: list[str], project: Path) -> DvcRun:
    logger = get_run_logger()
    logger.info("$ dvc %s", " ".join(args))
    return run_dvc(args, project, lambda line: logger.info("%s", line), env=_stage_env())


def write_params(form: RunParams, project: Path) -> dict[str, Any]:
    """Write the form's values into params.yaml; log and return what changed."""
    changed = apply_params(project / "params.yaml", params_updates(form))
    logger = get_run_logger()
    for key, (old, new) in changed.items():
        logger.info("params.yaml: %s: %r -> %r", key, old, new)
    if not changed:
        logger.info("params.yaml: already holds the form's values")
    return {key: new for key, (_, new) in changed.items()}


def reproduce(project: Path) -> tuple[DvcRun, list[dict[str, str]]]:
    """`dvc repro`, streamed; return the run and one row per stage (ran / skipped / failed / not reached)."""
    before = lock_entries(project)
    run = _dvc(["repro"], project)
    rows = stage_outcomes(stage_names(project), run, before, lock_entries(project))
    drift = lock_drift(rows)
    if drift:
        get_run_logger().warning("dvc.lock changed for %s although dvc repro did not say they ran", drift)
    return run, rows


def publish(project: Path, rows: list[dict[str, str]], started: float, succeeded: bool) -> list[str]:
    """Attach the stages table, and the schema report and metrics when they belong to this run's data."""
    create_table_artifact(rows, key=ARTIFACT_KEYS["stages"], description="Stages of `dvc repro`: ran or skipped")
    published = [ARTIFACT_KEYS["stages"]]
    outputs = runs.run_outputs(project, started, succeeded)
    if outputs.report is not None:
        create_markdown_artifact(outputs.report, key=ARTIFACT_KEYS["report"], description=outputs.report_description)
        published.append(ARTIFACT_KEYS["report"])
    if outputs.metrics is not None:
        create_table_artifact(outputs.metrics, key=ARTIFACT_KEYS["metrics"], description=outputs.metrics_description)
        published.append(ARTIFACT_KEYS["metrics"])
    return published


def push(project: Path) -> None:
    """`dvc push` to the default remote, streamed."""
    run = _dvc(["push"], project)
    if run.returncode != 0:
        raise runs.push_failure(run)


_task = {"cache_policy": NONE}  # every task has side effects on the project: never reuse a cached result


@flow(
    name=FLOW_NAME,
    validate_parameters=True,
    description="ImageNet archives -> verified Parquet: writes the form into params.yaml, then `dvc repro`.",
)
def imagenet_parquet(params: RunParams = RunParams()) -> dict[str, Any]:
    """Run the DVC pipeline with the form's values; Failed (with the failing check in the logs) when a stage fails."""
    project = runs.project_dir()
    preflight(params, project)
    if params.push:
        task(runs.check_remote, **_task)(project)
    changed = task(write_params, **_task)(params, project)
    started = time.time()
    run, rows = task(reproduce, **_task)(project)
    task(publish, **_task)(project, rows, started, run.returncode == 0)
    if run.returncode != 0:
        raise runs.repro_failure(run, rows)
    if params.push:
        task(push, **_task)(project)
    return {"changed_params": changed, "stages": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m flows.pipeline", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the deployment (polls the Prefect server for runs)")
    serve.add_argument(
        "--name",
        default=DEPLOYMENT,
        help=f"deployment name (default {DEPLOYMENT}); give each machine that serves the project its own name",
    )
    args = parser.parse_args(argv)
    runs.project_dir()
    if not get_current_settings().api.url:  # else Prefect would serve into a throw-away in-process server
        raise PipelineError(
            "PREFECT_API_URL is not set: expected the URL of a running Prefect server; start one "
            "(`make server`) and `export PREFECT_API_URL=http://127.0.0.1:4200/api` (or use "
            "`make serve`)"
        )
    # one run at a time per project: runs share params.yaml and the DVC workspace
    imagenet_parquet.serve(name=args.name, limit=1, pause_on_shutdown=False, tags=["imagenet-parquet"])


if __name__ == "__main__":
    from flows import pipeline  # serve the importable module's flow, not __main__'s copy
    from flows.cli import main as run_cli

    run_cli(pipeline.main, check_params=False)  # `serve` checks the project directory itself
