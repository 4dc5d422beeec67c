"""Hardening through real `dvc repro` runs (issue 14), the way a new user runs them: `.venv/bin/dvc` without activating
the environment; a password in params.yaml never reaches dvc.lock; a replaced source archive is noticed by a plain
`dvc repro`, an unchanged one reruns nothing and leaves dvc.lock byte-identical."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tasks.common import ARCHIVES

VENV = Path(sys.prefix)  # the environment running the tests: the project's .venv for a new user
BARE_PATH = os.pathsep.join(p for p in ("/usr/local/bin", "/usr/bin", "/bin") if Path(p).is_dir())


def _dvc(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`<venv>/bin/dvc ...` with a PATH that lacks the environment and nothing activated."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")}
    env["PATH"] = BARE_PATH
    return subprocess.run([str(VENV / "bin" / "dvc"), *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=300)


def _set(project: Path, **lines: str) -> None:
    params = project / "params.yaml"
    text = params.read_text()
    for old, new in lines.items():
        assert f"  {old}:" in text
        text = "\n".join(f"  {old}: {new}" if line.startswith(f"  {old}:") else line for line in text.splitlines())
    params.write_text(text + "\n")


def test_a_password_in_a_params_url_never_reaches_dvc_lock(project_copy):
    (project_copy / ".venv").symlink_to(VENV)
    (project_copy / "dvc.lock").unlink(missing_ok=True)
    _set(project_copy, source="http://user:secret123@127.0.0.1:9/ilsvrc")
    done = _dvc(project_copy, "repro", "download")
    assert done.returncode != 0
    assert "download.source: expected a URL without user info" in done.stderr and "~/.netrc" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    written = [project_copy / "dvc.lock", *(project_copy / "data").rglob("*"), *(project_copy / ".dvc").rglob("*")]
    leaked = [p for p in written if p.is_file() and b"secret123" in p.read_bytes()]
    assert leaked == [] and not (project_copy / "dvc.lock").exists()


def test_dvc_repro_without_activating_notices_a_replaced_source_and_nothing_else(project_copy, prefect_api,
                                                                                 sample_release, tmp_path):
    (project_copy / ".venv").symlink_to(VENV)  # what `make` creates in the project
    source = tmp_path / "archives"
    shutil.copytree(sample_release, source)
    _set(project_copy, source=str(source), checksums=str(source / "sample_md5.tsv"))
    first = _dvc(project_copy, "repro", "download", "verify")
    assert first.returncode == 0, first.stdout + first.stderr
    lock = (project_copy / "dvc.lock").read_bytes()
    again = _dvc(project_copy, "repro", "download", "verify")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Stage 'verify' didn't change, skipping" in again.stdout
    assert (project_copy / "dvc.lock").read_bytes() == lock, "an unchanged source must leave dvc.lock byte-identical"

    val, train = source / ARCHIVES["val"], source / ARCHIVES["train"]
    val.unlink()
    shutil.copy(train, val)  # rm + cp of another file, and the table updated to match
    table = (source / "sample_md5.tsv").read_text().splitlines()
    md5 = dict(line.split("\t") for line in table[1:])
    md5[ARCHIVES["val"]] = md5[ARCHIVES["train"]]
    (source / "sample_md5.tsv").write_text("name\tmd5\n" + "".join(f"{n}\t{m}\n" for n, m in md5.items()))
    third = _dvc(project_copy, "repro", "download", "verify")
    assert third.returncode == 0, third.stdout + third.stderr
    assert "Running stage 'verify'" in third.stdout
    assert os.path.samefile(project_copy / "data" / "raw" / ARCHIVES["val"], val)
