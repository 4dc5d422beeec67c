"""The dvc.yaml `validate` stage: `dvc metrics show` lists the counts, `dvc plots show` renders the per-split
class distribution as HTML, `dvc metrics diff` / `dvc params diff` work across commits."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from tests.helpers.datasets import make_dataset
from tests.test_validate_overlay import write_test_overlay


def _sh(project, *cmd: str) -> str:
    done = subprocess.run(cmd, cwd=project, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    assert done.returncode == 0, f"{cmd}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def _commit(project, message: str) -> None:
    _sh(project, "git", "add", "-A")
    _sh(project, "git", "-c", "user.name=t", "-c", "user.email=t@127.0.0.1", "commit", "-qm", message, "--allow-empty")


@pytest.mark.slow
def test_dvc_stage_metrics_plots_and_diffs(prefect_api, project_copy):
    project = project_copy
    ds = make_dataset(project / "data")
    ds.write()
    write_test_overlay(ds.parquet_dir)  # data/overlay (paths.overlay): what the curate stage writes
    _sh(project, "dvc", "repro", "--single-item", "validate")
    shown = json.loads(_sh(project, "dvc", "metrics", "show", "--json"))
    metrics = next(iter(shown.values()))["data"]["data/metrics/validate.json"]["data"]
    assert metrics["train"]["rows"] == 12 and metrics["val"]["rows"] == 6 and metrics["checks"]["fail"] == 0

    _sh(project, "dvc", "plots", "show", "-o", str(project.parent / "plots"))
    html = (project.parent / "plots" / "index.html").read_text()
    assert "data/reports/class_counts.csv" in html and '"xOffset": {"field": "split"' in html
    assert '"wnid": "n01484850"' in html and "Images per class and split" in html

    _commit(project, "validated")
    ds.drop("val", 2)
    ds.write()
    write_test_overlay(ds.parquet_dir)
    params = yaml.safe_load((project / "params.yaml").read_text())
    old_examples = params["validate"]["report_examples"]
    params["validate"]["report_examples"] = old_examples + 1
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    done = subprocess.run(["dvc", "repro", "--single-item", "validate"], cwd=project, capture_output=True, text=True)
    assert done.returncode != 0 and "class_set" in done.stderr  # a failed check fails the stage
    assert (project / "data" / "reports" / "schema_report.md").read_text().startswith(
        "# Schema and label validation: FAILED")
    diff = json.loads(_sh(project, "dvc", "metrics", "diff", "--json"))["data/metrics/validate.json"]
    assert diff["val.rows"] == {"old": 6, "new": 4, "diff": -2}
    params_diff = json.loads(_sh(project, "dvc", "params", "diff", "--json"))["params.yaml"]
    assert params_diff["validate.report_examples"] == {"old": old_examples, "new": old_examples + 1,
                                                        "diff": 1}
