"""The validate flow against a real Prefect server: keyed artifacts on the flow run, the CLI's exit status."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from flows.validate import ARTIFACT_KEYS, validate_flow
from tests.helpers.datasets import make_dataset
from tests.helpers.deployments import artifacts, table
from tests.helpers.params import validate_section, write_params
from tests.helpers.project import REPO
from tests.test_validate_overlay import write_test_overlay


def _project(root: Path, **params) -> Path:
    """A directory with params.yaml (paths relative to it) around a dataset under data/."""
    return write_params(root, validate=validate_section(**params).model_dump())


def test_flow_writes_reports_and_keyed_artifacts(prefect_api, tmp_path):
    ds = make_dataset(tmp_path / "data").write()
    write_test_overlay(ds.parquet_dir)  # data/overlay: paths.overlay
    state = validate_flow(params_file=str(_project(tmp_path)), return_state=True)
    assert state.is_completed(), state
    reports = tmp_path / "data" / "reports"
    assert sorted(p.name for p in reports.iterdir()) == ["class_counts.csv", "contact_sheet.png",
                                                         "near_duplicates.png", "near_duplicates_exclude.csv",
                                                         "schema_report.json", "schema_report.md"]
    metrics = json.loads((tmp_path / "data" / "metrics" / "validate.json").read_text())
    assert metrics["train"]["rows"] == 12 and metrics["val"]["rows"] == 6

    found = artifacts(state.state_details.flow_run_id)
    assert set(ARTIFACT_KEYS.values()) <= set(found)
    ui = found["progress-validate"]  # the scan's progress in the UI, at 100 % once the run ended
    assert ui.type == "progress" and ui.data == 100 and ui.description.startswith("validate: done, 18 img in ")
    report = found[ARTIFACT_KEYS["report"]]
    assert report.type == "markdown" and report.data == (reports / "schema_report.md").read_text()
    splits = found[ARTIFACT_KEYS["splits"]]
    assert splits.type == "table" and [(r["split"], r["rows"]) for r in table(splits)] == [("train", 12), ("val", 6)]
    rows = table(found[ARTIFACT_KEYS["classes"]])
    assert rows[2] == {"label": 2, "wnid": "n01484850", "name": "great white shark", "train": 4, "val": 2}


def test_stage_command_fails_with_a_summary_after_writing_the_reports(prefect_api, tmp_path):
    ds = make_dataset(tmp_path / "data")
    ds.drop("val", 1)
    ds.write()
    write_test_overlay(ds.parquet_dir)
    _project(tmp_path)
    done = subprocess.run([sys.executable, "-m", "flows.validate"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PREFECT_API_URL": prefect_api, "PYTHONPATH": str(REPO)}, timeout=180)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "error: validation failed: 2 check(s) failed" in done.stderr
    assert "  - class_set: 1 class(es) missing from a split — e.g. label 1 n01443537 'goldfish'" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout  # Prefect's log of the failed flow too (flows/cli.py)
    markdown = (tmp_path / "data" / "reports" / "schema_report.md").read_text()
    assert markdown.startswith("# Schema and label validation: FAILED")
    assert json.loads((tmp_path / "data" / "metrics" / "validate.json").read_text())["checks"]["fail"] == 2
