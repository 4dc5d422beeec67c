"""The operator's run form (a pydantic model) and how its values reach params.yaml.

The Prefect UI renders `RunParams` as the deployment's run form. A run writes the chosen values into params.yaml
(targeted round-trip edits that keep comments and every other key), then runs `dvc repro`: params.yaml stays the
one record of what a run used, `dvc params diff` shows it and a later `dvc repro` reproduces it.

The fields that map onto a params.yaml key take that key's type and bounds from its model (tasks.common.params),
so the form accepts exactly what the pipeline accepts; the edited params.yaml is validated whole before it is
written. The form's cross-field rules (`Rule`, `RULES`) are checked by the model in the flow run AND written into
its JSON schema, so the Prefect server refuses a run that breaks one before the run is created.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from yaml import safe_load

from tasks.common import PipelineError, write_text
from tasks.common.params import NESTED, SECTIONS, read_yaml, resolve_path, validate_params


def _like(section: str, key: str) -> Any:
    """The type of params.yaml `<section>.<key>` with its constraints (bounds, choices), for a form field."""
    info = {**SECTIONS, **NESTED}[section].model_fields[key]
    return Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation


# Form fields that are params.yaml keys: their types and bounds come from the params models (one set of rules).
PARAMS_FIELDS = {
    "policy": ("convert", "policy"),
    "quality": ("convert", "quality"),
    "resize_shorter": ("convert", "resize_shorter"),
    "exclude": ("curate", "exclude"),  # curation files: under curation/ (tasks/common/params.py), as params.yaml
    "relabel": ("curate", "relabel"),
    "max_side": ("convert", "max_side"),
}
if TYPE_CHECKING:  # what the models say, spelled out for type checkers
    PolicyField = str
    QualityField = int
    ResizeField = int | None
    CurationField = str | None
    MaxSideField = int | None
    FractionField = float
    SeedField = int
else:
    PolicyField = _like(*PARAMS_FIELDS["policy"])
    QualityField = _like(*PARAMS_FIELDS["quality"])
    ResizeField = _like(*PARAMS_FIELDS["resize_shorter"])
    CurationField = _like(*PARAMS_FIELDS["exclude"])  # relabel: the same type
    MaxSideField = _like(*PARAMS_FIELDS["max_side"])
    FractionField = _like("extract.holdout", "fraction")  # the holdout's keys: extract.holdout: {fraction, seed}
    SeedField = _like("extract.holdout", "seed")


class SourcePreset(str, Enum):
    """Where the images come from."""

    sample = "sample"
    archives = "imagenet1k-archives"
    folder = "imagenet100-folder"
    archive21k = "imagenet21k-archive"


class ClassSubset(str, Enum):
    """Which classes to keep."""

    all = "all"
    imagenet100 = "imagenet100"
    file = "file"


# ---------------------------------------------------------------- cross-field rules
@dataclass(frozen=True)
class Rule:
    """When field `when` has one of `when_in` (None: is set), field `then` must have one of `then_in` (None: be set)."""

    when: str
    when_in: tuple[str, ...] | None
    then: str
    then_in: tuple[str, ...] | None
    message: str


def holds(value: Any, allowed: tuple[str, ...] | None) -> bool:
    value = value.value if isinstance(value, Enum) else value
    return value not in (None, "") if allowed is None else value in allowed


def broken(rules: Sequence[Rule], form: Any) -> list[str]:
    """The messages of the rules `form` (an object with the fields as attributes) breaks."""
    return [
        r.message
        for r in rules
        if holds(getattr(form, r.when), r.when_in) and not holds(getattr(form, r.then), r.then_in)
    ]


def _schema_condition(field: str, allowed: tuple[str, ...] | None) -> dict[str, Any]:
    check = {"not": {"enum": [None, ""]}} if allowed is None else {"enum": list(allowed)}
    return {"properties": {field: check}, "required": [field]}


def rules_schema(schema: dict[str, Any], rules: Sequence[Rule]) -> None:
    """Add the rules to a JSON schema as `allOf` if/then conditions."""
    schema["allOf"] = [
        {"if": _schema_condition(r.when, r.when_in), "then": _schema_condition(r.then, r.then_in)} for r in rules
    ]


_NEEDS_21K = {  # the imagenet21k-archive preset's required fields
    "location": (
        "`location`: a directory or URL prefix holding the archive of per-class tars named by `archive` "
        "(e.g. winter21_whole.tar)"
    ),
    "archive": "`archive`: the archive's file name under `location` (a .tar, .tar.gz or .tgz), or its full path or URL",
    "catalog": "`catalog`: derived (the wnids alone) or a wnid<TAB>words table",
}
# Cross-field rules (Rule above): checked by the model and by the Prefect server's JSON schema.
RULES = (
    Rule(
        "preset",
        (SourcePreset.archives.value,),
        "location",
        None,
        "the imagenet1k-archives preset needs `location`: a directory or URL prefix holding the three official "
        "archives (ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar, ILSVRC2012_devkit_t12.tar.gz)",
    ),
    Rule(
        "preset",
        (SourcePreset.folder.value,),
        "location",
        None,
        "the imagenet100-folder preset needs `location`: the directory holding train/WNID/ and val/WNID/",
    ),
    *(
        Rule("preset", (SourcePreset.archive21k.value,), field, None, f"the imagenet21k-archive preset needs {what}")
        for field, what in _NEEDS_21K.items()
    ),
    Rule(
        "classes",
        (ClassSubset.file.value,),
        "classes_file",
        None,
        "classes=file needs `classes_file`: a text file with one class name per line",
    ),
)


def _rules_schema(schema: dict[str, Any]) -> None:
    rules_schema(schema, RULES)


class RunParams(BaseModel):
    """Run form of the imagenet-parquet pipeline. Every value is written into params.yaml before `dvc repro`."""

    model_config = ConfigDict(extra="forbid", use_enum_values=False, json_schema_extra=_rules_schema)

    preset: SourcePreset = Field(
        SourcePreset.sample,
        title="Source preset",
        description=(
            "sample: the built-in ILSVRC2012-shaped sample. imagenet1k-archives: the three official ILSVRC2012 "
            "archives at `location`. imagenet100-folder: an extracted train/WNID/, val/WNID/ tree at `location`. "
            "imagenet21k-archive: ImageNet-21k's one archive of per-class tars (`archive` under `location`), val "
            "held out of train (`holdout_fraction`, `holdout_seed`)."
        ),
    )
    location: str | None = Field(
        None,
        title="Source path or URL",
        description=(
            "Archives (ImageNet-1k or 21k): a directory or URL prefix (file://, http(s)://, s3://bucket/prefix). "
            "Folder: a directory on the machine that runs the flow. Unused for the sample."
        ),
    )
    classes: ClassSubset = Field(
        ClassSubset.all,
        title="Class subset",
        description=(
            "all: every class found. imagenet100: the CMC ImageNet100 list shipped with the project. "
            "file: the classes (wnids, or folder names) listed in `classes_file`."
        ),
    )
    classes_file: str | None = Field(
        None, title="Class list file", description="With classes=file: a text file with one class name per line."
    )
    archive: str | None = Field(
        "winter21_whole.tar",
        title="ImageNet-21k archive",
        description="imagenet21k-archive: the archive's file name under `location`, or a full path or URL; "
        ".tar (linked), .tar.gz / .tgz (decompressed once). Unused by the other presets.",
    )
    holdout_fraction: FractionField = Field(
        0.04,
        title="Held-out val fraction",
        description="imagenet21k-archive: the share of each class's images held out of train as val (chosen by "
        "a keyed hash of the image name: stable when images are added).",
    )
    holdout_seed: SeedField = Field(0, title="Holdout seed", description="imagenet21k-archive: keys the hash.")
    catalog: str | None = Field(
        "derived",
        title="Class catalogue",
        description="imagenet21k-archive: derived (class names are the wnids) or a wnid<TAB>words table "
        "(e.g. from the release's words.txt).",
    )
    policy: PolicyField = Field(
        "passthrough",
        title="Encoding policy",
        description=(
            "passthrough: store each JPEG's bytes as found (non-JPEG/CMYK images, and images larger than "
            "`resize_shorter` or `max_side`, are still converted). reencode: decode and re-encode every image as "
            "JPEG at `quality`."
        ),
    )
    quality: QualityField = Field(90, title="JPEG quality", description="When an image is (re-)encoded.")
    resize_shorter: ResizeField = Field(
        None,
        title="Resize shorter side",
        description=(
            "Resize images whose shorter side is larger to this many pixels (re-encoded; never upscaled). "
            "Empty: keep the size."
        ),
    )
    exclude: CurationField = Field(
        "curation/exclude.csv",
        title="Exclude list",
        description="A CSV split,wnid,name,reason of images to drop, under curation/ in the project (tracked: the "
        "curate stage reruns when it changes). Cleared (null): none.",
    )
    relabel: CurationField = Field(
        "curation/relabel.csv",
        title="Relabel table",
        description="A CSV split,wnid,name,new_wnid,reason of images to move to another class, under curation/ in the "
        "project. Cleared (null): none.",
    )
    max_side: MaxSideField = Field(
        None,
        title="Bound the longer side",
        description=(
            "Resize images whose longer side is larger to this many pixels, aspect kept (re-encoded at `quality`; "
            "never upscaled): a small training copy, e.g. 320 or 500. With `resize_shorter` the tighter bound "
            "applies. Empty: no bound."
        ),
    )
    push: bool = Field(
        False,
        title="dvc push",
        description=(
            "After a successful run, `dvc push` the tracked outputs (Parquet, label map, reports) to the default "
            "DVC remote."
        ),
    )

    @model_validator(mode="after")
    def _cross_field(self) -> RunParams:
        messages = broken(RULES, self)
        if messages:
            raise ValueError("; ".join(messages))
        return self


def params_updates(form: RunParams) -> dict[tuple[str, str], Any]:
    """The params.yaml keys (section, key) the form sets, and their values. Other keys keep their values."""
    folder, one = form.preset is SourcePreset.folder, form.preset is SourcePreset.archive21k
    classes = form.classes_file if form.classes is ClassSubset.file else form.classes.value
    updates = {
        # the folder preset reads no archives: the (tiny) built-in sample keeps download/verify cheap
        ("download", "source"): form.location
        if form.preset in (SourcePreset.archives, SourcePreset.archive21k)
        else "sample",
        ("download", "archive"): form.archive if one else None,
        ("extract", "mode"): "folder" if folder else "archive21k" if one else "archives",
        ("extract", "folder"): form.location if folder else None,
        ("extract", "classes"): classes,
        **{key: getattr(form, field) for field, key in PARAMS_FIELDS.items()},
    }
    if one:
        updates[("extract", "catalog")] = form.catalog
        updates[("extract", "holdout")] = _flow_map({"fraction": form.holdout_fraction, "seed": form.holdout_seed})
    elif not folder:  # ILSVRC2012: the devkit names the classes, the val archive is val (after a 21k run too)
        updates[("extract", "catalog")] = "auto"
        updates[("extract", "holdout")] = None
    return updates


def _flow_map(values: dict[str, Any]) -> CommentedMap:
    """A mapping written on one line (`{fraction: 0.04, seed: 0}`), as params.yaml's comments show it."""
    mapping = CommentedMap(values)
    mapping.fa.set_flow_style()
    return mapping


def _yaml() -> YAML:
    yaml = YAML()  # round-trip mode: comments, key order, flow-style lists and quoting survive
    yaml.representer.add_representer(type(None), lambda rep, _: rep.represent_scalar("tag:yaml.org,2002:null", "null"))
    return yaml


def apply_params(
    params_file: str | os.PathLike[str], updates: dict[tuple[str, str], Any]
) -> dict[str, tuple[Any, Any]]:
    """Write `updates` into params_file in place; return {"section.key": (old, new)} for the values that changed.

    The file is rewritten (atomically) only when a value changes, and only when the result validates whole
    (tasks.common.params); everything else in it is kept as written."""
    params_file = Path(params_file)
    read_yaml(params_file, str(params_file))  # UTF-8, valid YAML, each key once: one clear line, not a traceback
    yaml = _yaml()
    doc = yaml.load(params_file.read_text(encoding="utf-8"))
    changed = {}
    for (section, key), value in updates.items():
        if not isinstance(doc.get(section), dict) or key not in doc[section]:
            raise PipelineError(
                f"{params_file}: expected a key '{key}' in section '{section}:', found none; "
                "restore params.yaml from git (`git checkout params.yaml`)"
            )
        if doc[section][key] != value:
            changed[f"{section}.{key}"] = (doc[section][key], value)
            doc[section][key] = value
    if changed:
        text = io.StringIO()
        yaml.dump(doc, text)
        shown = f"{params_file} (with the run form's values)"
        validate_params(safe_load(text.getvalue()), shown, params_file.resolve().parent)
        write_text(params_file, text.getvalue())
    return changed


def _is_url(location: str) -> bool:
    return "://" in location


def preflight(form: RunParams, project: Path) -> None:
    """Checks that need the machine running the flow: local paths exist. Raise before anything is changed."""
    local = [("location", form.location)] if form.preset is not SourcePreset.sample else []
    if form.classes is ClassSubset.file:
        local.append(("classes_file", form.classes_file))
    local += [(field, getattr(form, field)) for field in ("exclude", "relabel")]  # curation files, in the project
    if form.preset is SourcePreset.archive21k:
        if form.archive and form.location and "/" not in form.archive and not _is_url(form.location):
            local.append(("archive", str(Path(form.location) / form.archive)))  # a file name under location
        elif form.archive and "/" in form.archive:
            local.append(("archive", form.archive))
        if form.catalog not in (None, "", "derived", "auto"):
            local.append(("catalog", form.catalog))
    for field, value in local:
        if value and not _is_url(value) and not resolve_path(project, value).exists():
            raise PipelineError(
                f"run form: `{field}` is {value!r}, which does not exist on this machine "
                f"(looked from {project}); expected an existing path — fix the field and run again"
            )
