"""What a Prefect UI run does to the project, without Prefect: find the project, check the DVC remote, say why a run
failed, and collect the outputs that belong to this run (flows/pipeline.py logs them and attaches them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.common import PipelineError
from tasks.common.layout import REPORT_MD
from tasks.common.params import load_project
from tasks.deploy.dvc_run import FAILED, DvcRun, metrics_rows, run_dvc


def project_dir(cwd: Path | None = None) -> Path:
    """The project this process serves: the working directory, which must hold dvc.yaml and params.yaml."""
    project = cwd or Path.cwd()
    missing = [name for name in ("dvc.yaml", "params.yaml") if not (project / name).is_file()]
    if missing:
        raise PipelineError(
            f"{project}: expected the imagenet-parquet project (dvc.yaml, params.yaml), "
            f"missing {missing}; start `python -m flows.pipeline serve` from the project directory"
        )
    return project


def check_remote(project: Path) -> None:
    """push=yes needs a default DVC remote: fail before anything runs when there is none."""
    found = run_dvc(["remote", "default"], project, lambda line: None)
    if found.returncode != 0 or not found.tail:
        raise PipelineError(
            f"{project}/.dvc/config: push=yes needs a default DVC remote, found none; add one "
            "(`dvc remote add -d <name> <url>`) or run with push=no"
        )


def repro_failure(run: DvcRun, rows: list[dict[str, str]]) -> PipelineError:
    """The error a failed `dvc repro` ends the run with: the stage that failed and the last lines it printed."""
    failed = [row["stage"] for row in rows if row["outcome"] == FAILED]
    where = f"stage '{failed[0]}'" if failed else "before any stage"
    return PipelineError(
        f"`dvc repro` failed in {where} (exit {run.returncode}); the stage's output is in this "
        "run's logs. Last lines:\n" + "\n".join(run.tail[-15:])
    )


def push_failure(run: DvcRun) -> PipelineError:
    return PipelineError(
        f"`dvc push` failed (exit {run.returncode}); see the lines above. Last output:\n" + "\n".join(run.tail[-10:])
    )


@dataclass(frozen=True)
class RunOutputs:
    """The schema report and the metrics, when they describe this run's data (None otherwise)."""

    report: str | None
    report_description: str
    metrics: list[dict[str, Any]] | None
    metrics_description: str


def run_outputs(project: Path, started: float, succeeded: bool) -> RunOutputs:
    """After a failure, only files (re)written during this run (mtime >= started) describe the current data."""
    where = load_project(project / "params.yaml")
    shown = where.params.paths  # as written in params.yaml, for the descriptions
    report = where.path("reports") / REPORT_MD
    metrics_dir = where.path("metrics")
    fresh_report = report.is_file() and (succeeded or report.stat().st_mtime >= started)
    fresh_metrics = metrics_dir.is_dir() and (
        succeeded or any(p.stat().st_mtime >= started for p in sorted(metrics_dir.glob("*.json")))
    )
    return RunOutputs(
        report.read_text(encoding="utf-8") if fresh_report else None,
        f"{shown.reports}/{REPORT_MD} (validate stage)",
        metrics_rows(metrics_dir) if fresh_metrics else None,
        f"DVC metrics: {shown.metrics}/*.json",
    )
