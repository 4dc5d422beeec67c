"""Extract flow: index the verified archives (or an ImageFolder tree) into manifests + the label map.

`python -m flows.extract` (the dvc.yaml `extract` stage) reads `params.yaml: extract` and `paths`."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.cli import main
from tasks.common import SPLITS
from tasks.common.layout import EXTRACT_REPORT
from tasks.common.params import load_project
from tasks.extract import materialize as imagefolder
from tasks.extract import stage as extract

scan = task(name="scan", task_run_name="scan-{split}", cache_policy=NO_CACHE)(extract.scan_split)
finalize = task(name="write-manifests", cache_policy=NO_CACHE)(extract.finalize_job)
materialize = task(name="materialize-imagefolder", cache_policy=NO_CACHE)(imagefolder.materialize)


@flow(name="extract")
def extract_flow(params_file: str = "params.yaml") -> dict[str, Any]:
    job = extract.job_from_params(load_project(params_file))
    for future in [scan.submit(job, split) for split in SPLITS]:
        future.result()  # re-raises a scan's PipelineError
    report = finalize(job)
    logger = get_run_logger()
    if job.tree is not None:
        logger.info(
            "ImageFolder tree written to %s: %s files", job.tree, materialize(job.manifests, job.tree, job.root)
        )
    logger.info(
        "manifests: %s images, %d classes, %d reported files (see %s)",
        report["images"],
        report["num_classes"],
        len(report["reported"]),
        job.manifests / EXTRACT_REPORT,
    )
    return report


if __name__ == "__main__":
    main(extract_flow)
