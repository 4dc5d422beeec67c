"""Typed params for tests: the repository's params.yaml with overrides, validated by the same models as a stage."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tasks.common.params import Params, Project, validate_params

REPO = Path(__file__).resolve().parents[1]


def repo_doc() -> dict[str, Any]:
    """params.yaml of the repository, parsed."""
    return yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))


def section(name: str, **overrides: Any) -> Any:
    """One typed section of the repository's params.yaml with `overrides` (a PipelineError naming the key when
    they are invalid, as a stage would raise)."""
    params = project(REPO, **{name: overrides}).params
    return getattr(params, "validation" if name == "validate" else name)


def project(root: Path, **sections: dict[str, Any]) -> Project:
    """A Project rooted at `root` whose params are the repository's, with per-section overrides."""
    doc = repo_doc()
    for name, overrides in sections.items():
        doc[name] = {**doc[name], **overrides}
    params: Params = validate_params(doc)
    return Project(Path(root), params, Path(root) / "params.yaml")


def write_params(root: Path, **sections: dict[str, Any]) -> Path:
    """params.yaml under `root`: the repository's, with per-section overrides (checked by the models first)."""
    doc = repo_doc()
    for name, overrides in sections.items():
        doc[name] = {**doc[name], **overrides}
    validate_params(doc)
    path = Path(root) / "params.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path
