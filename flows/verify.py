"""verify stage as a Prefect flow: `python -m flows.verify` (reads params.yaml `verify`, `paths`)."""

from __future__ import annotations

from typing import Any

from prefect import flow, task

from flows.cli import main
from tasks.acquire import verify as vf
from tasks.acquire.md5state import CACHE_NAME
from tasks.common.params import load_project

expected_md5s = task(name="expected-md5s")(vf.expected_md5s)
check_archive = task(name="check-archive")(vf.check_archive)
write_verify_json = task(name="write-verify-json")(vf.write_verify_json)


@flow(name="verify", log_prints=True)
def verify_flow(params_file: str = "params.yaml") -> dict[str, Any]:
    project = load_project(params_file)
    raw_dir, cache_file = project.path("raw"), project.path("work") / CACHE_NAME
    table, expected = expected_md5s(project.params.verify.checksums, raw_dir, project.root)
    splits = vf.archive_splits(raw_dir)
    results = {
        name: check_archive(name, raw_dir, md5, cache_file, table, split=splits.get(name))
        for name, md5 in expected.items()
    }
    write_verify_json(raw_dir, table, results)
    return {"archives": results, "checksums": table}


if __name__ == "__main__":
    main(verify_flow)
