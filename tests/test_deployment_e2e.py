"""End to end: the served deployment runs the real pipeline on the built-in sample, as pressing Run in the UI
with the default form does; the stage flows report to the same Prefect server."""
from __future__ import annotations

import datetime

import pytest

from tasks.common.params import load_project
from tasks.deploy.dvc_run import RAN, stage_names
from tasks.deploy.run_form import RunParams
from tasks.validate.report import REPORT_MD
from tests.helpers import deployments


@pytest.mark.slow
def test_ui_run_of_the_real_pipeline_on_the_sample(prefect_api, project_copy):
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterStartTime

    stages = stage_names(project_copy)
    started = datetime.datetime.now(datetime.timezone.utc)
    with deployments.serving(project_copy, "e2e") as name:
        run = deployments.run(name, RunParams().model_dump(mode="json"), timeout=600)
    assert run.state.is_completed(), run.state.message
    where = load_project(project_copy / "params.yaml").paths
    artifacts = deployments.artifacts(run.id)
    assert deployments.outcomes(artifacts["pipeline-stages"]) == dict.fromkeys(stages, RAN)
    assert artifacts["schema-report"].data == (project_copy / where["reports"] / REPORT_MD).read_text()
    metrics = deployments.table(artifacts["pipeline-metrics"])
    assert {row["file"] for row in metrics} == {"convert.json", "validate.json"}
    assert sorted((project_copy / where["parquet"]).rglob("*.parquet"))
    assert "Running stage 'validate'" in deployments.logs(run.id, until="Running stage 'validate'")
    with deployments.client() as client:
        stage_runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=stages)),
            flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=started)))
        flows = {flow.id: flow.name for flow in client.read_flows(flow_filter=FlowFilter(
            name=FlowFilterName(any_=stages)))}
    assert sorted(flows[r.flow_id] for r in stage_runs if r.state.is_completed()) == sorted(stages)
