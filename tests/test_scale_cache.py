"""No second copy: the project's DVC cache links outputs (reflink, else hardlink, else symlink) instead of copying
them; a stage that replaces its (persisted) out by rename never writes into the cache; `dvc pull` on a training
node leaves one copy on disk."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.helpers.project import GIT, REPO, cached_file

STAGE = """stages:
  make:
    cmd: python make.py
    deps: [make.py, value.txt]
    outs:
      - out: {persist: true}
"""
# writes out/a.bin and out/b.bin by rename (as tasks.common.files.atomic_path does), b only when it changed
MAKE = """import os, pathlib
value = pathlib.Path("value.txt").read_text()
out = pathlib.Path("out"); out.mkdir(exist_ok=True)
for name, data in (("a.bin", "a" * 4096), ("b.bin", value * 4096)):
    final = out / name
    if final.exists() and final.read_text() == data:
        continue
    tmp = out / f".{name}.tmp"
    tmp.write_text(data)
    os.replace(tmp, final)
"""


def _run(cmd: list[str], cwd: Path) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    assert done.returncode == 0, f"{cmd}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout


def _repo(root: Path) -> Path:
    """A git + DVC repo with the project's own .dvc/config and a one-stage pipeline with a persisted dir out."""
    root.mkdir()
    shutil.copytree(REPO / ".dvc", root / ".dvc", ignore=shutil.ignore_patterns("cache", "tmp", "config.local"))
    (root / "dvc.yaml").write_text(STAGE)
    (root / "make.py").write_text(MAKE)
    (root / "value.txt").write_text("1")
    (root / ".gitignore").write_text("/out\n")
    _run(["git", "init", "-q"], root)
    return root


def _one_copy(repo: Path, path: Path) -> bool:
    """True when the workspace file and its cache file are the same bytes on disk (hardlink/symlink/reflink)."""
    cache = cached_file(repo, path)
    if path.is_symlink():
        return path.resolve() == cache.resolve()
    return os.path.samefile(path, cache) or _reflinked(path, cache)


def _reflinked(a: Path, b: Path) -> bool:  # pragma: no cover - only on reflink filesystems (btrfs, xfs)
    probe = subprocess.run(["filefrag", "-v", str(a), str(b)], capture_output=True, text=True)
    return probe.returncode == 0 and "shared" in probe.stdout


def test_outs_link_the_cache_and_replacing_by_rename_keeps_it_intact(tmp_path):
    repo = _repo(tmp_path / "repo")
    _run(["dvc", "repro"], repo)
    a, b = repo / "out" / "a.bin", repo / "out" / "b.bin"
    assert _one_copy(repo, a) and _one_copy(repo, b)
    old_b = cached_file(repo, b)
    (repo / "value.txt").write_text("2")
    _run(["dvc", "repro"], repo)  # persist: the out is kept (DVC unprotects it), b.bin replaced by rename
    assert b.read_text() == "2" * 4096 and _one_copy(repo, b) and _one_copy(repo, a)
    assert old_b.read_text() == "1" * 4096, "the old cache object was written in place"
    assert "Data and pipelines are up to date" in _run(["dvc", "status"], repo)


def test_dvc_pull_on_a_training_node_leaves_one_copy(tmp_path):
    repo = _repo(tmp_path / "repo")
    _run(["dvc", "repro"], repo)
    _run(["dvc", "remote", "add", "-f", "-d", "local", str(tmp_path / "remote")], repo)
    _run(["dvc", "push"], repo)
    _run(["git", "add", "-A"], repo)
    _run([*GIT, "commit", "-qm", "repro"], repo)
    node = tmp_path / "node"
    _run(["git", "clone", "-q", str(repo), str(node)], tmp_path)
    _run(["dvc", "pull"], node)
    files = sorted((node / "out").iterdir())
    assert [f.name for f in files] == ["a.bin", "b.bin"]
    assert all(_one_copy(node, f) for f in files)
