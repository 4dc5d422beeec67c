"""The pipeline's deployment served from a project copy, and what flow runs leave on the Prefect server (their
logs and artifacts), read back through the API. Needs the `prefect_api` fixture (tests/conftest.py)."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.servers import stop_process, wait_for


def client():
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def deployment(name):
    """The deployment "<flow>/<deployment>", or None while it is not registered."""
    from prefect.exceptions import ObjectNotFound

    with client() as api:
        try:
            return api.read_deployment_by_name(name)
        except ObjectNotFound:
            return None


@contextlib.contextmanager
def serving(project: Path, name: str) -> Iterator[str]:
    """`python -m flows.pipeline serve --name <name>` from `project`; yields "<flow>/<name>" once registered."""
    from flows.pipeline import FLOW_NAME

    log_path = project.parent / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "flows.pipeline", "serve", "--name", name], cwd=project,
                                stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PREFECT_RUNNER_POLL_FREQUENCY": "1",
                                     "PREFECT_LOGGING_LEVEL": "INFO"})
        full_name = f"{FLOW_NAME}/{name}"
        try:
            wait_for(lambda: deployment(full_name), 90, log_path.read_text)
            yield full_name
        finally:
            stop_process(proc)


def run(name, params, timeout=180):
    """A run of deployment `name` with the form's `params`, as the UI's Run button creates it; waits for its end."""
    from prefect.deployments import run_deployment

    return run_deployment(name, parameters={"params": params}, timeout=timeout, poll_interval=1, as_subflow=False)


def logs(flow_run_id, until=None):
    """The run's log messages (polls until `until` appears: logs arrive in batches)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    def read():
        with client() as api:
            found = api.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                                  sort=LogSort.TIMESTAMP_ASC)
        text = "\n".join(log.message for log in found)
        return [text] if until is None or until in text else None

    return wait_for(read, 20, lambda: "no log line " + repr(until))[0]


def artifacts(flow_run_id):
    """The run's artifacts by key."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with client() as api:
        found = api.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(
            any_=[flow_run_id])))
    return {artifact.key: artifact for artifact in found}


def table(artifact):
    """A table artifact's rows (the API returns the table as JSON text)."""
    return json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data


def outcomes(artifact):
    """stage → outcome of a pipeline-stages table artifact."""
    return {row["stage"]: row["outcome"] for row in table(artifact)}
