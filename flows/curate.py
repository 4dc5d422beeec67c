"""Curate flow: the curation lines as the overlay beside the shards (`python -m flows.curate`, run by dvc.yaml).

Reads `params.yaml: curate` and `paths`; writes `<paths.overlay>/<split>.parquet` and `curation.json`. Never
rewrites a shard: a curation edit costs the overlay (a few MB at ImageNet scale), not a conversion."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.cli import main
from imagenet_parquet.format import FormatError
from tasks.common.generations import REMOVED, REPLACED
from tasks.common.params import load_project
from tasks.curate import stage as curate

write_overlays = task(name="write-overlays", cache_policy=NO_CACHE)(curate.write_overlays)


@flow(name="curate")
def curate_flow(params_file: str = "params.yaml") -> dict[str, Any]:
    job = curate.job_from_params(load_project(params_file))
    report = write_overlays(job)
    get_run_logger().info(
        "overlay written to %s: %s lines applied, %d naming images convert quarantined",
        job.overlay,
        len(report["applied"]),
        len(report["not_in_shards"]),
    )
    for split, found in report.get("source", {}).items():  # appended shards (issue 33): what the source changed
        get_run_logger().info(
            "%s: %d rows appended, %d removed from the source, %d replaced by a newer version (excluded)",
            split,
            found["appended"]["rows"],
            found[REMOVED]["rows"],
            found[REPLACED]["rows"],
        )
    return report


if __name__ == "__main__":
    main(curate_flow, user_errors=(FormatError,))
