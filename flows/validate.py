"""validate stage: schema and label checks + reports (`python -m flows.validate`, run by dvc.yaml).

Reads `params.yaml: validate` and `paths`. Writes the reports and metrics even when a check fails, attaches
the Markdown report (`schema-report`) and the counts (`split-counts`, `class-counts`) as artifacts of the flow
run, then fails the run (PipelineError → exit 1) when a check failed."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.cli import main
from imagenet_parquet.format import FormatError
from tasks.common import SPLITS
from tasks.common.layout import REPORT_MD
from tasks.common.params import load_project
from tasks.validate import changes, contact_sheet, near_dup, report
from tasks.validate import stage as validate

ARTIFACT_KEYS = {"report": "schema-report", "splits": "split-counts", "classes": "class-counts"}
METRICS_FILE = "validate.json"

run_checks = task(name="run-checks", cache_policy=NO_CACHE)(validate.run_validation)
write_sheet = task(name="contact-sheet", cache_policy=NO_CACHE)(contact_sheet.write_contact_sheet)
write_reports = task(name="write-reports", cache_policy=NO_CACHE)(report.write_reports)
write_near_dups = task(name="near-duplicates", cache_policy=NO_CACHE)(near_dup.write_near_duplicate_outputs)


def publish(result: dict[str, Any]) -> None:
    """The report and the counts as keyed artifacts of the current flow run."""
    create_markdown_artifact(
        report.render_markdown(result),
        key=ARTIFACT_KEYS["report"],
        description=f"Schema and label validation: {report.STATUS_WORD[result['status']]}",
    )
    split_metrics = report.metrics(result)
    create_table_artifact(
        [{"split": split, **split_metrics[split]} for split in SPLITS],
        key=ARTIFACT_KEYS["splits"],
        description="Rows, shards and images per class, per split",
    )
    create_table_artifact(result["classes"], key=ARTIFACT_KEYS["classes"], description="Images per class and split")


@flow(name="validate")
def validate_flow(params_file: str = "params.yaml") -> dict[str, Any]:
    """Check the Parquet shards against the contract, the manifests and the label map; write the reports."""
    project = load_project(params_file)
    cfg, where = project.params.validation, project.paths
    sheet = write_sheet.submit(
        where["parquet"],
        where["label_map"],
        where["reports"] / report.CONTACT_SHEET,
        cfg.contact_sheet_per_class,
        cfg.contact_sheet_classes,
        where["overlay"],
    )
    scan = where["work"] / "validate"  # per-shard byte findings kept for shards that did not change (scratch)
    result = run_checks(where["parquet"], where["manifests"], where["label_map"], cfg, where["overlay"], scan)
    result["changes"] = changes.record_version(where["versions"], result.pop("version"))
    write_reports(result, where["reports"], where["metrics"] / METRICS_FILE)
    write_near_dups(result, where["parquet"], where["reports"])
    publish(result)
    sheet.result()  # after the reports: they are written even if drawing the sheet fails
    get_run_logger().info(
        "validation %s: report %s", report.STATUS_WORD[result["status"]], where["reports"] / REPORT_MD
    )
    validate.raise_if_failed(result, where["reports"])
    return result


if __name__ == "__main__":
    main(validate_flow, user_errors=(FormatError,))
