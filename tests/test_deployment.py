"""The UI deployment's mechanics against a real Prefect server, on a project copy whose dvc.yaml has tiny
stand-in stages (tests/test_deployment_e2e.py runs the real ones; tests/test_deployment_form.py needs no server).

`python -m flows.pipeline serve` runs in a subprocess from the copy; runs are triggered through the API with
parameters, as the UI's Run button does."""
from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tasks.deploy.dvc_run import FAILED, RAN, SKIPPED
from tests.helpers import deployments
from tests.helpers.project import copy_project
from tests.helpers.servers import stop_process, wait_for

# Stand-in stages: each prints to stdout and stderr and writes small outputs from its params section;
# validate fails when convert.quality < 20, naming the failed check, as the real validate stage does.
STANDIN = '''\
import json, pathlib, sys, yaml
stage = sys.argv[1]
params = yaml.safe_load(open("params.yaml"))
print(f"standin {stage}: stdout line")
print(f"standin {stage}: stderr line", file=sys.stderr)
def write(path, obj):
    path = pathlib.Path(path); path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj, sort_keys=True))
if stage in ("download", "extract", "convert"):
    write(f"data/{stage}/out.json", params[stage])
if stage == "verify":
    write("data/verify/out.json", json.loads(open("data/download/out.json").read()))
if stage == "convert":
    write("data/metrics/convert.json", {"images": {"train": 200, "val": 50}, "quality": params["convert"]["quality"]})
if stage == "validate":
    quality = params["convert"]["quality"]
    ok = quality >= 20
    write("data/reports/schema_report.md", "# Schema report\\n\\n| check | result |\\n|---|---|\\n"
          f"| quality_floor | {'passed' if ok else 'FAILED'} |\\n")
    if not ok:
        print(f"check 'quality_floor' failed: convert.quality is {quality}, expected >= 20", file=sys.stderr)
        sys.exit(1)
    write("data/metrics/validate.json", {"rows": {"train": 200, "val": 50}, "failed_checks": 0})
'''
STANDIN_DVC = {"stages": {
    "download": {"cmd": "python standin.py download", "params": ["download"], "outs": ["data/download"]},
    "verify": {"cmd": "python standin.py verify", "deps": ["data/download"], "outs": ["data/verify"]},
    "extract": {"cmd": "python standin.py extract", "params": ["extract"], "deps": ["data/verify"],
                "outs": ["data/extract"]},
    "convert": {"cmd": "python standin.py convert", "params": ["convert"], "deps": ["data/extract"],
                "outs": ["data/convert"], "metrics": [{"data/metrics/convert.json": {"cache": False}}]},
    "validate": {"cmd": "python standin.py validate", "deps": ["data/convert"], "params": ["convert.quality"],
                 "outs": ["data/reports"], "metrics": [{"data/metrics/validate.json": {"cache": False}}]},
}}
STAGES = list(STANDIN_DVC["stages"])


def standin_project(dest: Path) -> Path:
    project = copy_project(dest)
    (project / "standin.py").write_text(STANDIN)
    (project / "dvc.yaml").write_text(yaml.safe_dump(STANDIN_DVC, sort_keys=False))
    return project


@pytest.fixture(scope="module")
def served(prefect_api, tmp_path_factory):
    """The deployment served from a stand-in copy with a local DVC remote; yields (project, name, remote)."""
    project = standin_project(tmp_path_factory.mktemp("ui") / "project")
    remote = tmp_path_factory.mktemp("dvc-remote")
    subprocess.run([sys.executable, "-m", "dvc", "remote", "add", "--local", "-d", "uitest", str(remote)],
                   cwd=project, check=True, capture_output=True)
    with deployments.serving(project, "standin") as name:
        yield project, name, remote


def test_ui_run_writes_params_runs_dvc_and_publishes_artifacts(served):
    project, name, remote = served
    first = deployments.run(name, {"policy": "reencode", "quality": 80})
    assert first.state.is_completed(), first.state.message
    logs = deployments.logs(first.id, until="standin validate: stderr line")
    assert "standin download: stdout line" in logs and "params.yaml: convert.quality: 90 -> 80" in logs
    params = yaml.safe_load((project / "params.yaml").read_text())
    assert params["convert"]["policy"] == "reencode" and params["convert"]["quality"] == 80
    diff = subprocess.run([sys.executable, "-m", "dvc", "params", "diff", "--json"], cwd=project, check=True,
                          capture_output=True, text=True).stdout
    quality = json.loads(diff)["params.yaml"]["convert.quality"]
    assert (quality["old"], quality["new"]) == (90, 80)
    artifacts = deployments.artifacts(first.id)
    assert deployments.outcomes(artifacts["pipeline-stages"]) == dict.fromkeys(STAGES, RAN)
    assert artifacts["schema-report"].data == (project / "data/reports/schema_report.md").read_text()
    metrics = {(row["file"], row["metric"]): row["value"] for row in deployments.table(artifacts["pipeline-metrics"])}
    assert metrics[("convert.json", "quality")] == 80 and metrics[("validate.json", "rows.train")] == 200

    # same inputs but a new quality and push=yes: the upstream stages are skipped, then DVC pushes
    second = deployments.run(name, {"policy": "reencode", "quality": 70, "push": True})
    assert second.state.is_completed(), second.state.message
    rows = deployments.table(deployments.artifacts(second.id)["pipeline-stages"])
    assert {r["stage"]: r["outcome"] for r in rows} == {**dict.fromkeys(STAGES[:3], SKIPPED), "convert": RAN,
                                                        "validate": RAN}
    assert {r["stage"]: r["dvc.lock"] for r in rows} == {**dict.fromkeys(STAGES[:3], "unchanged"),
                                                         "convert": "updated", "validate": "updated"}
    assert "$ dvc push" in deployments.logs(second.id, until="files pushed") and any(remote.rglob("*"))
    # the UI run is an ordinary DVC state: `dvc repro` from a shell has nothing left to do
    repro = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=project, capture_output=True, text=True)
    assert repro.returncode == 0 and "up to date" in repro.stdout, repro.stdout + repro.stderr


def test_failing_validation_fails_the_run_with_the_check_in_its_logs(served):
    project, name, _ = served
    failed = deployments.run(name, {"quality": 10})
    assert failed.state.is_failed()
    assert "stage 'validate'" in failed.state.message
    logs = deployments.logs(failed.id, until="check 'quality_floor' failed")
    assert "convert.quality is 10, expected >= 20" in logs
    artifacts = deployments.artifacts(failed.id)
    assert deployments.outcomes(artifacts["pipeline-stages"])["validate"] == FAILED
    assert "| quality_floor | FAILED |" in artifacts["schema-report"].data  # the report of the failed check


def test_invalid_parameters_are_rejected_before_anything_runs(served):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
    from prefect.exceptions import PrefectHTTPStatusError

    project, name, _ = served
    params_before = (project / "params.yaml").read_text()
    with deployments.client() as client:
        deployment = client.read_deployment_by_name(name)
        runs_before = len(client.read_flow_runs(deployment_filter=DeploymentFilter(
            name=DeploymentFilterName(any_=[deployment.name]))))
    # 1. the server checks the form's schema: no flow run is created
    for bad, reason in [({"preset": "imagenet1k-archives"}, "'location' is a required property"),
                        ({"quality": 0}, "0 is less than the minimum of 1")]:
        with pytest.raises(PrefectHTTPStatusError, match=reason):
            deployments.run(name, bad)
    with deployments.client() as client:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
            name=DeploymentFilterName(any_=[deployment.name])))
    assert len(runs) == runs_before
    # 2. a path that does not exist on the serving machine: the run fails before params.yaml or DVC is touched
    missing = deployments.run(name, {"preset": "imagenet100-folder", "location": "/nonexistent/imagenet100"})
    assert missing.state.is_failed() and "does not exist on this machine" in missing.state.message
    assert "$ dvc repro" not in deployments.logs(missing.id)
    assert (project / "params.yaml").read_text() == params_before


def test_pydantic_check_stops_a_run_created_without_schema_enforcement(served):
    """Even a run created with enforcement off (API clients can) stops at parameter validation, before any task."""
    from prefect.client.schemas.actions import DeploymentFlowRunCreate

    project, name, _ = served
    params_before = (project / "params.yaml").read_text()
    with deployments.client() as client:
        deployment = client.read_deployment_by_name(name)
        response = client.request("POST", "/deployments/{id}/create_flow_run", path_params={"id": deployment.id},
                                  json=DeploymentFlowRunCreate(parameters={"params": {"classes": "file"}},
                                                               enforce_parameter_schema=False)
                                  .model_dump(mode="json", exclude_unset=True))
        run_id = response.json()["id"]
        run = wait_for(lambda: (r := client.read_flow_run(run_id)).state.is_final() and r, 120)
    assert run.state.is_failed()
    assert "classes=file needs `classes_file`" in run.state.message
    assert (project / "params.yaml").read_text() == params_before
    assert "$ dvc" not in deployments.logs(run.id)


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-dev-shm-usage",
                  "--window-size=1280,1600", "--remote-debugging-port=0"]


@contextlib.contextmanager
def chromium_page(chromium: str, profile: Path):
    """A headless chromium, driven over the DevTools protocol: yields call(method, **params) -> result."""
    from websockets.sync.client import connect

    proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        active = profile / "DevToolsActivePort"
        port = wait_for(lambda: active.is_file() and active.read_text().split("\n")[0].strip(), 60)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=10) as resp:
            target = next(t for t in json.load(resp) if t["type"] == "page")
        with connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            ids = iter(range(1, 1_000_000))

            def call(method, **params):
                ident = next(ids)
                ws.send(json.dumps({"id": ident, "method": method, "params": params}))
                while (message := json.loads(ws.recv(timeout=60))).get("id") != ident:
                    pass  # events
                return message["result"]

            yield call
    finally:
        stop_process(proc)


def test_run_form_page_renders_in_headless_chromium(served, tmp_path):
    """Smoke test of the UI: the deployment's custom-run page renders the form (titles from the pydantic model).
    The page text is checked; a screenshot is kept for a human (tmp_path/run-form.png)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is absent (Debian: apt-get install -y chromium)")
    _, name, _ = served
    api = os.environ["PREFECT_API_URL"]
    with urllib.request.urlopen(api.removesuffix("/api") + "/ui-settings", timeout=10) as resp:
        ui_api = json.load(resp)["api_url"]
    assert urllib.parse.urljoin(api, ui_api) == api, (
        f"the server's UI talks to {ui_api}, not {api}: the prefect_api fixture must start the server with "
        "PREFECT_UI_API_URL=<its api url> (Prefect derives it from port 4200, not from --port)")
    url = f"{api.removesuffix('/api')}/deployments/deployment/{deployments.deployment(name).id}/run"
    expected = (*name.split("/"), "Source preset", "Encoding policy", "JPEG quality", "dvc push")
    with chromium_page(chromium, tmp_path / "profile") as call:
        call("Page.navigate", url=url)

        seen = [""]

        def text():
            found = call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''")
            seen[0] = found["result"].get("value", "")
            return all(t in seen[0] for t in expected)

        wait_for(text, 90, lambda: f"{url} does not show {expected}; it shows:\n{seen[0]}")
        png = call("Page.captureScreenshot", format="png")["data"]
    (tmp_path / "run-form.png").write_bytes(base64.b64decode(png))
    assert (tmp_path / "run-form.png").stat().st_size > 10_000
