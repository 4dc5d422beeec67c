"""Hardening through a real `dvc repro` (issue 14): a password in params.yaml never reaches dvc.lock. (A replaced
source noticed, an unchanged one leaving dvc.lock byte-identical, `.venv/bin/dvc` without activating:
tests/test_acquire_dvc.py.)"""
from __future__ import annotations

from tests.helpers.project import unactivated_dvc


def test_a_password_in_a_params_url_never_reaches_dvc_lock(project_copy):
    (project_copy / "dvc.lock").unlink(missing_ok=True)
    params = project_copy / "params.yaml"
    params.write_text(params.read_text().replace("  source: sample", "  source: http://user:secret123@127.0.0.1:9/x"))
    done = unactivated_dvc(project_copy, "repro", "download")
    assert done.returncode != 0
    assert "download.source: expected a URL without user info" in done.stderr and "~/.netrc" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    written = [project_copy / "dvc.lock", *(project_copy / "data").rglob("*"), *(project_copy / ".dvc").rglob("*")]
    assert [p for p in written if p.is_file() and b"secret123" in p.read_bytes()] == []
    assert not (project_copy / "dvc.lock").exists()
