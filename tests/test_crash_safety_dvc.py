"""Crash safety of `dvc repro` on the sample (issue 28, item 13 d, e): a second `dvc repro` in the same checkout while
one runs is refused by DVC's repository lock with a clear message and changes nothing; `kill -9` at seeded moments
leaves nothing half-written under a final name, and the rerun's dvc.lock is byte-identical to an uninterrupted run's.

One project copy, as few runs as possible (~2.5 sample pipelines): the uninterrupted run (with the concurrent one
refused during it), then from scratch two runs killed at seeded moments, then the completing rerun."""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.helpers.params import write_params
from tests.helpers.project import BARE_PATH, VENV, copy_project

SAMPLE = {"classes": 4, "train_per_class": 6, "val_per_class": 2, "seed": 0}  # the sample, smaller: the same stages


def _start(repo: Path) -> subprocess.Popen[str]:
    """`.venv/bin/dvc repro` as tests.helpers.project.unactivated_dvc runs it, in its own process group (killable
    whole: dvc and the stage it runs)."""
    if not (repo / ".venv").exists():
        (repo / ".venv").symlink_to(VENV)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")}
    return subprocess.Popen([str(VENV / "bin" / "dvc"), "repro"], cwd=repo, env={**env, "PATH": BARE_PATH},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finish(run: subprocess.Popen[str], timeout: float = 300) -> str:
    out, _ = run.communicate(timeout=timeout)
    assert run.returncode == 0, out[-4000:]
    return out


def _wait_for(path: Path, run: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert run.poll() is None and time.monotonic() < deadline, "dvc repro ended before writing " + str(path)
        time.sleep(0.05)


def _stats(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in directory.iterdir()}


def _final_names_whole(repo: Path) -> list[str]:
    """Every file under data/ that is not a temporary name (`.name.tmp-<pid>`, `.part`) reads back whole."""
    checked = []
    for path in sorted((repo / "data").rglob("*")):
        if not path.is_file() or path.name.startswith(".") or path.name.endswith(".part"):
            continue
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".parquet":
            pq.read_metadata(path)
        elif path.suffix == ".tar":
            with tarfile.open(path) as tar:
                tar.getmembers()
        checked.append(str(path.relative_to(repo)))
    return checked


@pytest.mark.slow
def test_a_concurrent_repro_is_refused_and_kill_9_at_seeded_moments_then_a_rerun_gives_the_same_dvc_lock(
        tmp_path, prefect_api):
    repo = copy_project(tmp_path / "project")
    write_params(repo, sample=SAMPLE)
    committed = (repo / "dvc.lock").read_bytes()

    # (d) a second `dvc repro` while the first runs: refused, clearly, touching nothing. In the first's download
    # stage DVC's lock on download.json refuses it; in a later stage (DVC locks only the running stage's deps and
    # outs) the pipeline's own run claim does, before its download stage replaces what the first one reads
    started = time.monotonic()
    first = _start(repo)
    for when, refused_by in (("data/raw", ("is busy, it is being blocked by", "Unable to acquire lock")),
                             ("data/manifests", ("expected no other run of this project's pipeline, found one",))):
        _wait_for(repo / when, first)
        before = _stats(repo / "data/raw")
        second = _start(repo)
        refused, _ = second.communicate(timeout=120)
        assert second.returncode != 0 and "Traceback" not in refused, refused
        assert any(message in refused for message in refused_by), refused
        assert _stats(repo / "data/raw") == before or when == "data/raw", refused
    _finish(first)
    duration = time.monotonic() - started
    reference = (repo / "dvc.lock").read_bytes()

    # (e) from scratch again; kill -9 (dvc and its stage) at seeded moments, then rerun to the end
    shutil.rmtree(repo / "data")
    shutil.rmtree(repo / ".dvc/cache", ignore_errors=True)  # no run cache: the stages really run again
    (repo / "dvc.lock").write_bytes(committed)
    seeded = random.Random(28)  # % of the uninterrupted run's duration: one early, one later
    moments = [seeded.randrange(5, 30), seeded.randrange(30, 60)]
    killed = []
    for percent in moments:
        run = _start(repo)
        time.sleep(duration * percent / 100)
        os.killpg(run.pid, signal.SIGKILL)
        out, _ = run.communicate(timeout=60)
        killed.append(re.findall(r"Running stage '(\w+)'", out)[-1:])
        _final_names_whole(repo)
    _finish(_start(repo))
    print(f"killed at {moments} % of {duration:.0f} s, in stages {killed}")
    assert (repo / "dvc.lock").read_bytes() == reference, f"killed at {moments} % of {duration:.0f} s in {killed}"
    left = [str(p.relative_to(repo)) for p in (repo / "data").rglob(".*tmp-*")]
    assert left == [], left


HOLDER = """
import sys, time
from pathlib import Path
from tasks.common.runlock import claim_run
claim_run(Path(sys.argv[1]), "convert")
print("claimed", flush=True)
time.sleep(120)
"""


def test_a_stage_of_a_second_run_is_refused_while_the_first_runs_and_takes_over_once_it_is_killed(tmp_path):
    """The run claim alone, and through a stage command (refused before Prefect starts, in a second)."""
    from tasks.common import PipelineError
    from tasks.common.runlock import claim_run
    from tests.helpers.project import REPO

    write_params(tmp_path, paths={"raw": "raw", "work": "work"})
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "work")], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, start_new_session=True)  # another run: its own group
    try:
        assert holder.stdout.readline() == "claimed\n"
        with pytest.raises(PipelineError) as err:
            claim_run(tmp_path / "work", "download")
        said = f"{tmp_path / 'work/pipeline-run.json'}: expected no other run of this project's pipeline, found one"
        assert said + f" running (stage convert, process {holder.pid}: " in str(err.value)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        stage = subprocess.run([sys.executable, "-m", "flows.download"], cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=120)
        assert stage.returncode == 1 and "error: " in stage.stderr and "found one running (stage convert" in \
            stage.stderr and "Traceback" not in stage.stderr, stage.stderr
        assert not (tmp_path / "raw").exists()
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    claim_run(tmp_path / "work", "download")  # killed: its claim is taken over
    claim_run(tmp_path / "work", "verify")  # the same run's next stage (this process group)
    assert json.loads((tmp_path / "work/pipeline-run.json").read_text())["stage"] == "verify"
