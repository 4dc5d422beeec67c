"""Typed params for tests: the repository's params.yaml with overrides, validated by the same models as a stage."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tasks.common.params import Project, ValidateParams, validate_params
from tests.helpers.project import REPO

# validate: over the repository's params.yaml: bounds that fit the tiny test datasets, every image decoded
VALIDATE_DEFAULTS = {"train_count": [1, 1300], "val_count": [1, 50], "decode_sample": "all", "leakage_max_pairs": 0,
                     "report_examples": 5, "contact_sheet_per_class": 2, "contact_sheet_classes": 20}


def repo_doc() -> dict[str, Any]:
    """params.yaml of the repository, parsed."""
    return yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))


def _overridden(sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The repository's params document with per-section overrides (not validated yet)."""
    doc = repo_doc()
    for name, overrides in sections.items():
        doc[name] = {**doc[name], **overrides}
    return doc


def section(name: str, **overrides: Any) -> Any:
    """One typed section of the repository's params.yaml with `overrides` (a PipelineError naming the key when
    they are invalid, as a stage would raise)."""
    params = project(REPO, **{name: overrides}).params
    return getattr(params, "validation" if name == "validate" else name)


def validate_section(**overrides: Any) -> ValidateParams:
    """The typed `validate:` params for tests: VALIDATE_DEFAULTS, then `overrides`."""
    return section("validate", **{**VALIDATE_DEFAULTS, **overrides})


def project(root: Path, **sections: dict[str, Any]) -> Project:
    """A Project rooted at `root` whose params are the repository's, with per-section overrides."""
    return Project(Path(root), validate_params(_overridden(_curation(root, sections))))


def _curation(root: Path, sections: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`curate:` nulled where `root` holds no curation/ (it is no copy of the project), unless given."""
    if (Path(root) / "curation").is_dir():
        return sections
    return {"curate": {"exclude": None, "relabel": None}, **sections}


def write_params(root: Path, **sections: dict[str, Any]) -> Path:
    """params.yaml under `root`: the repository's, with per-section overrides (checked by the models first)."""
    path = Path(root) / "params.yaml"
    doc = _overridden(_curation(root, sections))
    validate_params(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path
