"""The import rules of pyproject.toml's [tool.importlinter] (run by `make lint` too): the layers flows -> tasks ->
imagenet_parquet, no import cycle at any depth (function-level imports count), and stage packages that never import
each other. The same checker is shown to fail on a small tree that breaks each rule, so the check cannot pass
vacuously."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")


def _lint_imports(cwd: Path, config: Path) -> subprocess.CompletedProcess[str]:
    if LINT_IMPORTS is None:
        pytest.fail("lint-imports not found: install the lint/test extras (`pip install -e '.[test,lint]'`)")
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", str(config)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )


def test_the_project_keeps_its_import_rules() -> None:
    proc = _lint_imports(ROOT, ROOT / "pyproject.toml")
    assert proc.returncode == 0, f"lint-imports (pyproject.toml [tool.importlinter]):\n{proc.stdout}\n{proc.stderr}"
    assert "3 kept, 0 broken" in proc.stdout, proc.stdout


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_the_checker_fails_on_a_cycle_a_cross_stage_import_and_an_import_back_up(tmp_path: Path) -> None:
    """The project's own contracts, over a tree that has a function-level cycle, a stage importing another stage
    and the reader importing the pipeline."""
    config = ROOT / "pyproject.toml"
    _write(tmp_path, {
        "flows/__init__.py": "",
        "flows/run.py": "import tasks.convert.stage\n",
        "tasks/__init__.py": "",
        "tasks/common/__init__.py": "",
        "tasks/common/a.py": "def f():\n    from tasks.common import b\n",  # a lazy import still counts
        "tasks/common/b.py": "from tasks.common import a\n",
        "tasks/convert/__init__.py": "",
        "tasks/convert/stage.py": "from tasks.common import a\n",
        "tasks/curate/__init__.py": "",
        "tasks/curate/compact.py": "from tasks.convert import stage\n",
        "tasks/acquire/__init__.py": "",
        "tasks/extract/__init__.py": "",
        "tasks/validate/__init__.py": "",
        "tasks/deploy/__init__.py": "",
        "tasks/views/__init__.py": "",
        "imagenet_parquet/__init__.py": "import flows.run\n",
    })
    shutil.copy2(config, tmp_path / "pyproject.toml")
    proc = _lint_imports(tmp_path, tmp_path / "pyproject.toml")
    assert proc.returncode != 0, proc.stdout
    assert "0 kept, 3 broken" in proc.stdout, proc.stdout
    assert "tasks.curate is not allowed to import tasks.convert" in proc.stdout, proc.stdout
    assert "No cycles are allowed in tasks.common" in proc.stdout, proc.stdout
