"""Where the repository is, and a fresh git + DVC copy of its working tree for tests that run `dvc repro`,
`dvc push` or a deployment (never on the checkout itself)."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"  # real-data facts and images (present in CI)
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@127.0.0.1"]


def copy_project(dest: Path) -> Path:
    """Copy the working tree (tracked + untracked-not-ignored files; no data/, no .venv) into a fresh git repo."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    for rel in sorted(filter(None, listed)):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    subprocess.run([*GIT, "commit", "-qm", "copy"], cwd=dest, check=True)
    return dest


VENV = Path(sys.prefix)  # the environment running the tests: the project's own .venv for a new user
BARE_PATH = os.pathsep.join(p for p in ("/usr/local/bin", "/usr/bin", "/bin") if Path(p).is_dir())


def unactivated_dvc(project: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`.venv/bin/dvc ARGS` in `project` as a new user runs it: nothing activated, a PATH without the environment,
    the project's `.venv` (a link to the test environment) the only way the stage commands find their Python."""
    if not (project / ".venv").exists():
        (project / ".venv").symlink_to(VENV)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")}
    env["PATH"] = BARE_PATH
    return subprocess.run([str(VENV / "bin" / "dvc"), *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=timeout)


ALWAYS_CHANGED = "download:\n\talways changed\n"  # dvc.yaml: download stats the source on every run (issue 14)


def up_to_date(status: str) -> bool:
    """`dvc status` output says nothing is stale but the download stage (always_changed: it only stats the
    source, and an unchanged source changes no output, so nothing after it reruns)."""
    rest = status.replace(ALWAYS_CHANGED, "").strip()
    return rest in ("", "Data and pipelines are up to date.")


def cached_file(repo: Path, path: Path) -> Path:
    """The file of `repo`'s DVC cache named by the MD5 of `path`'s bytes (files/md5/xx/...)."""
    digest = hashlib.md5(path.read_bytes()).hexdigest()
    return repo / ".dvc" / "cache" / "files" / "md5" / digest[:2] / digest[2:]
