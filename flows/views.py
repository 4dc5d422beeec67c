"""Views flow: the named subsets of params.yaml `views:` (`python -m flows.views`, run by dvc.yaml).

Reads `params.yaml: views` and `paths`; writes `<paths.views>/<name>/<split>.parquet` and `views.json`. Never
writes a shard: a view costs a file of a few bytes per row, not a conversion."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.cli import main
from imagenet_parquet.format import FormatError
from tasks.common.params import load_project
from tasks.views import stage as views

write_views = task(name="write-views", cache_policy=NO_CACHE)(views.write_views)


@flow(name="views")
def views_flow(params_file: str = "params.yaml") -> dict[str, Any]:
    job = views.job_from_params(load_project(params_file))
    report = write_views(job)
    logger = get_run_logger()
    for name, entry in report.items():
        rows = ", ".join(
            f"{split} {s['rows']} rows ({s['image_bytes']} image bytes)" for split, s in entry["splits"].items()
        )
        logger.info("view %s: %d classes, %s", name, len(entry["classes"]), rows)
    logger.info("views written to %s: %d", job.views_dir, len(report))
    return report


if __name__ == "__main__":
    main(views_flow, user_errors=(FormatError,))
