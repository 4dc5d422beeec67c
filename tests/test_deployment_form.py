"""The run form, its JSON schema, the form -> params.yaml writer and the DVC output parsing (no Prefect server).
The served deployment is tested in tests/test_deployment.py."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from tasks.common import PipelineError
from tasks.deploy.dvc_run import DvcRun, FAILED, lock_drift, metrics_rows, NOT_REACHED, RAN, SKIPPED, stage_outcomes, stream_lines
from tasks.deploy.run_form import apply_params, params_updates, preflight, RunParams

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("fields, message", [
    ({"preset": "imagenet1k-archives"}, "imagenet1k-archives preset needs `location`"),
    ({"preset": "imagenet100-folder", "location": ""}, "imagenet100-folder preset needs `location`"),
    ({"classes": "file"}, "classes=file needs `classes_file`"),
    ({"resize_shorter": 0}, "greater than or equal to 1"),
    ({"quality": 0}, "greater than or equal to 1"),
    ({"preset": "imagenet21k-archive"}, "imagenet21k-archive preset needs `location`"),
    ({"preset": "imagenet21k-archive", "location": "/d", "archive": ""}, "imagenet21k-archive preset needs `archive`"),
    ({"preset": "imagenet21k-archive", "location": "/d", "catalog": None}, "imagenet21k-archive preset needs `catalog`"),
    ({"preset": "imagenet21k-archive", "location": "/d", "holdout_fraction": 1}, "Input should be less than 1"),
    ({"preset": "imagenet21k-archive", "location": "/d", "holdout_seed": -1}, "greater than or equal to 0"),
    ({"preset": "imagenet"}, "'sample', 'imagenet1k-archives', 'imagenet100-folder' or 'imagenet21k-archive'"),
    ({"colour": "red"}, "Extra inputs are not permitted"),
    ({"exclude": "../outside-exclude.csv"}, "exclude\n  Value error, expected a relative path under curation/"),
    ({"relabel": "/abs/relabel.csv"}, "relabel\n  Value error, expected a relative path under curation/"),
])
def test_form_rejects_invalid_values_with_a_clear_message(fields, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(")) as err:
        RunParams(**fields)
    assert len(err.value.errors()) == 1


@pytest.mark.parametrize("fields", [
    {"preset": "imagenet1k-archives"}, {"classes": "file", "classes_file": None}, {"resize_shorter": 0},
    {"preset": "imagenet21k-archive"}, {"preset": "imagenet21k-archive", "location": "/d", "archive": None},
    {"preset": "imagenet21k-archive", "location": "/d", "holdout_fraction": 0},
    {"quality": 101}, {"policy": "lossless"}, {"exclude": "../outside-exclude.csv"}, {"relabel": "data/r.csv"},
])
def test_json_schema_the_server_enforces_rejects_what_the_model_rejects(fields):
    """The Prefect server validates a run's parameters against the deployment's JSON schema before creating the
    run: the cross-field rules are in that schema, so the UI refuses them too."""
    from prefect.utilities.schema_tools.validation import ValidationError as SchemaError
    from prefect.utilities.schema_tools.validation import validate

    from flows.pipeline import imagenet_parquet

    schema = imagenet_parquet.parameters.model_dump()
    with pytest.raises(ValidationError):
        RunParams(**fields)
    with pytest.raises(SchemaError):
        validate({"params": fields}, schema, raise_on_error=True)
    validate({"params": RunParams().model_dump(mode="json")}, schema, raise_on_error=True)


def test_form_values_reach_params_yaml_with_comments_and_other_keys_kept(tmp_path):
    params_file = tmp_path / "params.yaml"
    original = (REPO / "params.yaml").read_text()
    params_file.write_text(original)
    assert apply_params(params_file, params_updates(RunParams())) == {}  # the defaults are params.yaml's values
    assert params_file.read_text() == original

    form = RunParams(preset="imagenet1k-archives", location="s3://bucket/ilsvrc: 2012", classes="imagenet100",
                     policy="reencode", quality=85, resize_shorter=256)
    changed = apply_params(params_file, params_updates(form))
    assert changed == {"download.source": ("sample", "s3://bucket/ilsvrc: 2012"),
                       "extract.classes": ("all", "imagenet100"), "convert.policy": ("passthrough", "reencode"),
                       "convert.quality": (90, 85), "convert.resize_shorter": (None, 256)}
    new = params_file.read_text()
    assert yaml.safe_load(new)["download"]["source"] == "s3://bucket/ilsvrc: 2012"
    changed_lines = [(a, b) for a, b in zip(original.splitlines(), new.splitlines()) if a != b]
    assert len(original.splitlines()) == len(new.splitlines()) and len(changed_lines) == 5
    assert all(a.split(":")[0] == b.split(":")[0] for a, b in changed_lines)  # same keys
    assert all(a.partition(" #")[2] == b.partition(" #")[2] for a, b in changed_lines)  # same comments

    folder = RunParams(preset="imagenet100-folder", location="/data/imagenet100", classes="file",
                       classes_file="my_classes.txt")
    apply_params(params_file, params_updates(folder))
    params = yaml.safe_load(params_file.read_text())
    assert params["download"]["source"] == "sample"
    assert {key: params["extract"][key] for key in ("mode", "folder", "classes")} == {
        "mode": "folder", "folder": "/data/imagenet100", "classes": "my_classes.txt"}


def test_the_imagenet21k_preset_writes_what_a_hand_written_params_yaml_for_archive21k_holds(tmp_path):
    """README "ImageNet-21k": download.source + archive, extract.mode archive21k, catalog, holdout; back to the
    sample afterwards restores ILSVRC2012's keys (a valid params.yaml each time)."""
    params_file = tmp_path / "params.yaml"
    original = (REPO / "params.yaml").read_text()
    params_file.write_text(original)
    form = RunParams(preset="imagenet21k-archive", location="/data/imagenet21k", archive="winter21_whole.tar",
                     holdout_fraction=0.04, holdout_seed=0, catalog="derived")
    changed = apply_params(params_file, params_updates(form))
    hand = yaml.safe_load(original)  # the README's example, typed into params.yaml by hand
    hand["download"].update(source="/data/imagenet21k", archive="winter21_whole.tar")
    hand["extract"].update(mode="archive21k", catalog="derived", holdout={"fraction": 0.04, "seed": 0})
    assert yaml.safe_load(params_file.read_text()) == hand
    assert set(changed) == {"download.source", "download.archive", "extract.mode", "extract.catalog",
                            "extract.holdout"}
    line = next(x for x in params_file.read_text().splitlines() if x.lstrip().startswith("holdout:"))
    assert line.startswith("  holdout: {fraction: 0.04, seed: 0}") and " # " in line  # one line, comment kept

    apply_params(params_file, params_updates(RunParams()))
    back = params_file.read_text()  # the sample again: archive null, catalog auto, holdout null
    assert yaml.safe_load(back) == yaml.safe_load(original) and len(back.splitlines()) == len(original.splitlines())


def test_preflight_refuses_a_local_path_that_does_not_exist(tmp_path):
    with pytest.raises(PipelineError, match="`exclude` is 'curation/exclude.csv', which does not exist on this machine"):
        preflight(RunParams(), tmp_path)  # the curation files: in the project, under curation/
    (tmp_path / "curation").mkdir()
    (tmp_path / "curation/exclude.csv").write_text("split,wnid,name,reason\n")
    preflight(RunParams(relabel=None), tmp_path)
    (tmp_path / "curation/relabel.csv").write_text("split,wnid,name,new_wnid,reason\n")
    missing = RunParams(preset="imagenet100-folder", location=str(tmp_path / "nope"))
    with pytest.raises(PipelineError, match="`location` is .*nope.*does not exist on this machine"):
        preflight(missing, tmp_path)
    (tmp_path / "classes.txt").write_text("n01440764\n")
    preflight(RunParams(classes="file", classes_file="classes.txt"), tmp_path)  # relative to the project
    preflight(RunParams(preset="imagenet1k-archives", location="http://127.0.0.1:9/ilsvrc"), tmp_path)
    (tmp_path / "in21k").mkdir()
    with pytest.raises(PipelineError, match="`archive` is .*in21k/winter21_whole.tar.*does not exist on this machine"):
        preflight(RunParams(preset="imagenet21k-archive", location=str(tmp_path / "in21k")), tmp_path)
    (tmp_path / "in21k/winter21_whole.tar").write_bytes(b"")
    with pytest.raises(PipelineError, match="`catalog` is 'words.tsv', which does not exist on this machine"):
        preflight(RunParams(preset="imagenet21k-archive", location=str(tmp_path / "in21k"), catalog="words.tsv"),
                  tmp_path)
    preflight(RunParams(preset="imagenet21k-archive", location=str(tmp_path / "in21k")), tmp_path)
    preflight(RunParams(preset="imagenet21k-archive", location="s3://bucket/in21k"), tmp_path)


def test_stage_outcomes_name_the_failed_stage_and_lock_drift_is_reported():
    stages = ["download", "verify", "extract"]
    died = DvcRun(1, {"download": SKIPPED, "verify": RAN})  # no "failed to reproduce" line: the last one ran
    rows = stage_outcomes(stages, died, {"download": 1}, {"download": 2})
    assert [row["outcome"] for row in rows] == [SKIPPED, FAILED, NOT_REACHED]
    assert [row["dvc.lock"] for row in rows] == ["updated", "unchanged", "unchanged"]
    assert lock_drift(rows) == ["download"]  # its lock changed though DVC said it skipped it


def test_stream_lines_passes_lines_and_throttles_progress_redraws():
    out = io.BytesIO("start\n\r 10%\r 20%\r 30%\nstage: éł\r\n\n".encode())
    assert list(stream_lines(out, progress_every=3600)) == ["start", " 10%", " 30%", "stage: éł"]


def test_metrics_rows_flatten_every_json(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps({"rows": {"val": 5, "train": 20}, "bad": [1, 2]}))
    (tmp_path / "a.json").write_text(json.dumps({"ok": True}))
    assert metrics_rows(tmp_path) == [
        {"file": "a.json", "metric": "ok", "value": True},
        {"file": "b.json", "metric": "bad", "value": "[1, 2]"},
        {"file": "b.json", "metric": "rows.train", "value": 20},
        {"file": "b.json", "metric": "rows.val", "value": 5},
    ]


def test_push_without_a_default_remote_is_refused_up_front(tmp_path):
    from tasks.deploy.runs import check_remote

    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    with pytest.raises(PipelineError, match="push=yes needs a default DVC remote"):
        check_remote(tmp_path)  # (with a remote it passes: test_ui_run_... pushes)


def test_the_holdout_fields_take_the_params_models_bounds():
    from tasks.common.params import HoldoutParams

    form, model = RunParams.model_json_schema()["properties"], HoldoutParams.model_json_schema()["properties"]
    for field, key in (("holdout_fraction", "fraction"), ("holdout_seed", "seed")):
        assert {k: v for k, v in form[field].items() if k not in ("title", "description", "default")} == \
            {k: v for k, v in model[key].items() if k not in ("title", "description", "default")}
