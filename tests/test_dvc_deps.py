"""dvc.yaml deps that cannot drift: every project module a stage imports (transitively, including imports inside
functions) lies under one of that stage's deps, so a code change always reruns the stages it can affect."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "tasks", "imagenet_parquet")
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def _module_file(name: str) -> Path | None:
    """The file of project module `name` (a package's __init__.py), None when it is not a project module."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = REPO.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imported(path: Path) -> set[str]:
    """Module names `path` imports anywhere (not under `if TYPE_CHECKING:`); `from a import b` yields a and a.b."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts)
    if path.name == "__init__.py":
        package = package.rsplit(".", 1)[0] + ".__init__" if "." in package else package + ".__init__"
    names: set[str] = set()
    nodes = [ast.parse(path.read_text(encoding="utf-8"))]
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            nodes += node.orelse
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from .x import y
                base = package.rsplit(".", node.level)[0]
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
            names |= {f"{module}.{alias.name}" for alias in node.names}
        nodes += list(ast.iter_child_nodes(node))
    return names


def project_imports(entry: str) -> set[Path]:
    """Every project file that running `python -m <entry>` can import, transitively."""
    seen: set[Path] = set()
    todo = [entry]
    while todo:
        for name in _with_parents(todo.pop()):
            path = _module_file(name)
            if path is None or path in seen:
                continue
            seen.add(path)
            todo += sorted(_imported(path))
    return seen


def _covered(path: Path, deps: list[str]) -> bool:
    rel = path.relative_to(REPO)
    return any(rel == Path(dep) or Path(dep) in rel.parents for dep in deps)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_the_stage_deps_cover_every_project_module_it_imports(stage):
    cmd = STAGES[stage]["cmd"].split()
    assert cmd[:2] == ["scripts/python", "-m"], cmd  # scripts/python: the project's interpreter (README)
    imported = project_imports(cmd[2])
    assert REPO / Path(*cmd[2].split(".")).with_suffix(".py") in imported
    missing = sorted(str(p.relative_to(REPO)) for p in imported if not _covered(p, STAGES[stage]["deps"]))
    assert not missing, f"dvc.yaml stage '{stage}' imports {missing} without listing them (or a folder above) in deps"


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_stage_imports_no_other_stage_package(stage):
    """Stage packages meet only in tasks.common and the format modules imagenet_parquet.format, .overlay, .writer
    (the one shard writer) and .markers (the JPEG marker reader and decoder gate; the layout the code map
    describes)."""
    imported = project_imports(STAGES[stage]["cmd"].split()[2])
    packages = {
        p.relative_to(REPO).parts[1]
        for p in imported
        if p.relative_to(REPO).parts[0] == "tasks" and len(p.relative_to(REPO).parts) > 2
    }
    own = {"download": "acquire", "verify": "acquire"}.get(stage, stage)
    assert packages <= {"common", own}, packages
    reader = {p.relative_to(REPO).as_posix() for p in imported if p.relative_to(REPO).parts[0] == "imagenet_parquet"}
    allowed = {"__init__.py", "format.py", "overlay.py", "writer.py", "markers.py"}
    assert reader <= {f"imagenet_parquet/{name}" for name in allowed}, reader


def test_the_import_walk_sees_imports_inside_functions_and_relative_ones(tmp_path):
    """The checker itself: a function-level import and a relative import are both followed."""
    found = {p.relative_to(REPO).as_posix() for p in project_imports("imagenet_parquet.datasets")}
    assert {"imagenet_parquet/format.py", "imagenet_parquet/shards.py", "imagenet_parquet/partition.py"} <= found
    found = {p.relative_to(REPO).as_posix() for p in project_imports("tasks.acquire.md5state")}
    assert "tasks/common/files.py" in found  # through `from tasks.common import write_json`
