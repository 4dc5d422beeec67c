"""params.yaml as typed models: unknown keys refused, every problem named by key, paths resolved one way, the run
form agreeing with the models, dvc.yaml's params lists following the models."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from pydantic import ValidationError

from tasks.acquire import download as dl
from tasks.acquire.local import check_local_sources
from tasks.acquire.verify import expected_md5s
from tasks.common import PipelineError
from tasks.common.params import STAGE_SECTIONS, dvc_params, load_project, validate_params
from tasks.convert.job import job_from_params
from tasks.deploy.run_form import PARAMS_FIELDS, RunParams, apply_params, params_updates
from tasks.extract import stage as extract
from tests.helpers.params import project, repo_doc, write_params
from tests.helpers.project import REPO


def test_the_repository_params_validate():
    loaded = load_project(REPO / "params.yaml")
    assert loaded.root == REPO and loaded.path("parquet") == REPO / "data" / "parquet"


@pytest.mark.parametrize("section, overrides, message", [
    ("convert", {"qualty": 50}, "convert.qualty: unknown key (did you mean quality?)"),
    ("download", {"retries": "many"}, "download.retries: expected an integer in [0, 1000], found 'many'"),
    ("download", {"retries": -1}, "download.retries: expected an integer in [0, 1000], found -1"),
    ("convert", {"resize_shorter": 0}, "convert.resize_shorter: expected an integer in [1, 65536] or null, found 0"),
    ("convert", {"workers": True}, "convert.workers: expected an integer in [1, 4096] or one of auto, found True"),
    ("convert", {"policy": "fast"}, "convert.policy: expected one of passthrough, reencode, found 'fast'"),
    ("convert", {"task_runner": "dask", "dask_address": None},
     "convert.dask_address: expected a scheduler address (tcp://host:8786) with task_runner: dask, found null"),
    ("extract", {"mode": "folder", "folder": None}, "extract.folder: expected the root of the train/<class>"),
    ("extract", {"materialize": "yes"}, "extract.materialize: expected true or false, found 'yes'"),
    ("validate", {"decode_sample": "some"}, "validate.decode_sample: expected a row count (int >= 0), a fraction"),
    ("validate", {"train_count": [5, 1]}, "validate.train_count: expected [min, max] with min <= max, found [5, 1]"),
    ("verify", {"checksums": ""}, "verify.checksums: expected auto | official | sample | a name<TAB>md5 table"),
    ("sample", {"classes": 0}, "sample.classes: expected an integer in [1, 1000], found 0"),
])
def test_a_bad_value_names_the_key_what_was_expected_and_what_was_found(tmp_path, section, overrides, message):
    with pytest.raises(PipelineError) as err:
        project(tmp_path, **{section: overrides})
    assert message in str(err.value)
    assert "fix them and run again" in str(err.value)


def test_every_problem_is_listed_at_once_and_unknown_sections_too():
    doc = repo_doc()
    doc["convrt"] = {}
    del doc["sample"]["seed"]
    doc["download"]["timeout_s"] = 0
    with pytest.raises(PipelineError) as err:
        validate_params(doc, "params.yaml")
    lines = str(err.value).splitlines()
    assert lines[0].startswith("params.yaml: 3 problem(s)")
    assert lines[1:] == ["  - convrt: unknown key (did you mean convert?)",
                         "  - download.timeout_s: expected a number > 0 and <= 86400, found 0",
                         "  - sample.seed: missing; expected an integer >= 0"]


def test_a_stage_command_stops_before_any_work_and_prints_no_traceback(tmp_path):
    params = write_params(tmp_path)
    params.write_text(params.read_text().replace("retries: 5", "retries: many\n  colour: red"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)  # no server needed: the check comes first
    done = subprocess.run([sys.executable, "-m", "flows.download"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "download.retries: expected an integer in [0, 1000], found 'many'" in done.stderr
    assert "download.colour: unknown key" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not (tmp_path / "data").exists()  # nothing was written


def test_paths_resolve_against_the_params_file_whatever_the_working_directory(tmp_path, monkeypatch):
    root, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (root / "tree" / "train").mkdir(parents=True)
    (root / "lists").mkdir()
    (root / "lists" / "classes.txt").write_text("n01440764\n")
    (root / "md5.tsv").write_text("name\tmd5\n" + "".join(f"{n}\t{'0' * 32}\n" for n in dl.ARCHIVES.values()))
    setup = project(root, extract={"mode": "folder", "folder": "tree", "classes": "lists/classes.txt"},
                    download={"source": "archives"}, verify={"checksums": "md5.tsv"})
    job = dl.plan(setup)
    assert job.raw_dir == root / "data" / "raw" and job.cache_file.parent == root / "data" / "scratch"
    with pytest.raises(PipelineError, match=str(root / "archives" / dl.ARCHIVES["train"])):
        check_local_sources(dl.archive_sources(setup.params.download), job.root)  # (folder mode needs none)
    assert expected_md5s("md5.tsv", root / "data" / "raw", setup.root)[0] == "md5.tsv"
    scan = extract.job_from_params(setup)  # reads the class list (relative to the project) at once
    assert scan.inputs == {"train": root / "tree", "val": root / "tree"} and scan.staging.is_relative_to(root)
    convert = job_from_params(setup.params.convert, setup.paths, setup.root)
    assert convert.parquet == root / "data" / "parquet" and convert.root == root
    assert not any(elsewhere.iterdir())


def test_the_dvc_yaml_params_of_each_stage_leave_out_exactly_the_speed_only_keys():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert set(stages) == set(STAGE_SECTIONS)
    for stage in STAGE_SECTIONS:
        assert stages[stage]["params"] == dvc_params(stage), stage
    speed = {"download.retries", "download.backoff_s", "download.timeout_s", "download.chunk_mb",
             "extract.materialize", "convert.workers", "convert.task_runner", "convert.dask_address", "validate.workers"}
    listed = {key for stage in STAGE_SECTIONS for key in dvc_params(stage)}
    assert not speed & listed and {"download.source", "convert.quality", "validate.decode_sample"} <= listed


# ---------------------------------------------------------------- the run form and the models agree
def _constraints(schema: dict) -> dict:
    return {k: v for k, v in schema.items() if k not in ("title", "description", "default")}


def test_form_fields_that_are_params_keys_take_the_models_types_and_bounds():
    from tasks.common.params import SECTIONS

    form = RunParams.model_json_schema()["properties"]
    for field, (section, key) in PARAMS_FIELDS.items():
        model = SECTIONS[section].model_json_schema()["properties"][key]
        assert _constraints(form[field]) == _constraints(model), field


@pytest.mark.parametrize("policy", ["passthrough", "reencode", "lossless"])
@pytest.mark.parametrize("quality", [0, 1, 100, 101])
@pytest.mark.parametrize("resize_shorter", [None, 0, 1, 16, 65536, 65537])
def test_the_form_accepts_exactly_what_the_pipeline_accepts(tmp_path, policy, quality, resize_shorter):
    fields = {"policy": policy, "quality": quality, "resize_shorter": resize_shorter}
    try:
        form = RunParams(**fields)
    except ValidationError:
        form = None
    try:
        project(tmp_path, convert=fields)
        pipeline_accepts = True
    except PipelineError:
        pipeline_accepts = False
    assert (form is not None) == pipeline_accepts, fields
    if form is not None:  # and what the form writes validates whole
        params_file = tmp_path / "params.yaml"
        params_file.write_text((REPO / "params.yaml").read_text())
        apply_params(params_file, params_updates(form))
        assert load_project(params_file).params.convert.resize_shorter == resize_shorter


def test_a_form_value_the_models_refuse_never_reaches_params_yaml(tmp_path):
    params_file = tmp_path / "params.yaml"
    params_file.write_text((REPO / "params.yaml").read_text())
    before = params_file.read_text()
    with pytest.raises(PipelineError, match=r"convert.quality: expected an integer in \[1, 100\], found 500"):
        apply_params(params_file, {("convert", "quality"): 500})
    assert params_file.read_text() == before


# ---------------------------------------------------------------- issue 36: curation files tracked, params.yaml read strictly
CURATION_PATHS = ["curation/exclude.csv", "curation/sub/mine.csv", "../outside-exclude.csv", "/tmp/curation/x.csv",
                  "curation/../outside.csv", "data/exclude.csv", "curation", "curation/", "curation/.hidden.csv",
                  "./curation/exclude.csv", "curation//x.csv", ""]


@pytest.mark.parametrize("value", CURATION_PATHS)
def test_a_curation_file_must_be_under_the_curate_stages_dependency_and_the_form_agrees(tmp_path, value):
    """A curation file outside curation/ is no input of the curate stage (an edit would rerun nothing): the params
    model refuses it naming the key, the run form and the JSON schema the Prefect server checks refuse it too."""
    from prefect.utilities.schema_tools.validation import ValidationError as SchemaError
    from prefect.utilities.schema_tools.validation import validate

    from flows.pipeline import imagenet_parquet

    accepted = value in ("curation/exclude.csv", "curation/sub/mine.csv")
    for key in ("exclude", "relabel"):
        if accepted:
            assert getattr(project(tmp_path, curate={key: value}).params.curate, key) == value
            assert getattr(RunParams(**{key: value}), key) == value
            continue
        with pytest.raises(PipelineError) as err:
            project(tmp_path, curate={key: value})
        problem = str(err.value).splitlines()[1]
        assert problem == (f"  - curate.{key}: expected a relative path under curation/ (the curate stage's dependency "
                           f"in dvc.yaml: an edit reruns the stage), found {value!r}; move the file into curation/ and "
                           "give its path there")
        with pytest.raises(ValidationError, match="expected a relative path under curation/"):
            RunParams(**{key: value})
        with pytest.raises(SchemaError):
            validate({"params": {key: value}}, imagenet_parquet.parameters.model_dump(), raise_on_error=True)


def test_dvc_yaml_lists_the_curation_directory_as_a_dependency_of_curate():
    from tasks.common.params import CURATION_DIR

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert CURATION_DIR in stages["curate"]["deps"]
    assert all(value.startswith(f"{CURATION_DIR}/") for value in repo_doc()["curate"].values() if value)


@pytest.mark.parametrize("edit, message", [
    (lambda text: text.replace("  quality: 90", "  quality: 90\n  quality: 50"),
     r"params.yaml:(\d+): convert.quality: expected each key once, found it again \(first at line (\d+);"),
    (lambda text: text + "convert:\n  quality: 50\n",
     r"params.yaml:(\d+): convert: expected each key once, found it again \(first at line (\d+);"),
    (lambda text: text.replace("holdout: null", "holdout: {fraction: 0.1, seed: 1, seed: 2}"),
     r"params.yaml:(\d+): extract.holdout.seed: expected each key once, found it again \(first at line (\d+);"),
])
def test_a_key_given_twice_in_params_yaml_is_refused_naming_it_and_its_lines(tmp_path, edit, message):
    params = write_params(tmp_path)
    params.write_text(edit(params.read_text()))
    with pytest.raises(PipelineError, match=message) as err:
        load_project(params)
    assert "\n" not in str(err.value)


def test_params_yaml_not_utf8_or_doubled_keys_is_one_line_from_a_stage_run_by_hand_and_the_run_form(tmp_path):
    params = write_params(tmp_path)
    good = params.read_text()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    for data, message in [
        (good.replace("quality: 90", "quality: 90 # qualit\xe9").encode("latin-1"),
         rf"params.yaml:{good[:good.index('quality: 90')].count(chr(10)) + 1}: expected UTF-8 text, found the bytes "
         r"b'\\xe9'; save the file as UTF-8"),
        (good.replace("  quality: 90", "  quality: 90\n  quality: 50").encode(), "convert.quality: expected each key once"),
    ]:
        params.write_bytes(data)
        done = subprocess.run([sys.executable, "-m", "flows.curate"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 1 and "Traceback" not in done.stderr + done.stdout, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: params.yaml:"), done.stderr
        assert __import__("re").search(message, lines[0]), lines[0]
        with pytest.raises(PipelineError, match=message):
            apply_params(params, params_updates(RunParams(quality=80)))
        assert params.read_bytes() == data
