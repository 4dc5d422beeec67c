"""params.yaml as typed models: one pydantic model per section (tasks/common/param_sections.py), unknown keys refused,
every problem named by key.

`load_project(params_file)` reads and validates the whole file once, before a stage does any work, and returns a
`Project`: the typed sections plus the project root (the directory of params.yaml), against which every relative
path in params.yaml resolves — in every stage. A problem reads `convert.qualty: unknown key (did you mean
quality?)` or `download.retries: expected an integer >= 0, found 'many'`; all problems are listed at once.

Keys marked `speed_only` change how fast a stage runs, never what it writes: dvc.yaml leaves them out of the
stage's params, so changing them reruns nothing (`dvc_params()` gives each stage's list; a test checks dvc.yaml)."""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from tasks.common.errors import PipelineError
from tasks.common.param_sections import (
    ConvertParams,
    CurateParams,
    DownloadParams,
    ExtractParams,
    HoldoutParams,
    PathsParams,
    SampleParams,
    Section,
    ValidateParams,
    VerifyParams,
    path_key,
)

__all__ = [  # the sections' models are re-exported: `from tasks.common.params import ConvertParams` stays the way
    "NESTED",
    "SECTIONS",
    "STAGE_SECTIONS",
    "ConvertParams",
    "CurateParams",
    "DownloadParams",
    "ExtractParams",
    "HoldoutParams",
    "Params",
    "PathsParams",
    "Project",
    "SampleParams",
    "Section",
    "ValidateParams",
    "VerifyParams",
    "describe",
    "dvc_params",
    "load_project",
    "output_keys",
    "path_key",
    "read_yaml",
    "resolve_path",
    "validate_params",
]


class Params(BaseModel):
    """The whole params.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    paths: PathsParams
    sample: SampleParams
    download: DownloadParams
    verify: VerifyParams
    extract: ExtractParams
    convert: ConvertParams
    validation: ValidateParams = Field(alias="validate")  # `validate` is a BaseModel method name
    curate: CurateParams

    @model_validator(mode="after")
    def _one_archive_mode(self) -> Params:
        """download.archive is the input of extract.mode: archive21k, and only of it (each a message by key)."""
        download, mode = self.download, self.extract.mode
        if mode != "archive21k":
            if download.archive:
                raise ValueError(
                    f"download.archive: expected null with extract.mode: {mode} (set extract.mode: archive21k for "
                    f"an archive of per-class tars), found {download.archive!r}"
                )
            return self
        per_archive = [key for key in ("train", "val", "devkit") if getattr(download, key)]
        if not download.archive or per_archive:
            found = f"download.{per_archive[0]}: {getattr(download, per_archive[0])!r}" if per_archive else "null"
            raise ValueError(
                "download.archive: expected the archive (a file name under download.source, or a path or URL) and "
                f"download.train / val / devkit null with extract.mode: archive21k, found {found}"
            )
        if download.source == "sample" and "/" not in download.archive:
            raise ValueError(
                "download.archive: expected a path or URL with download.source: sample (the sample holds no "
                f"ImageNet-21k archive), found {download.archive!r}; set download.source to its directory"
            )
        return self


# The params.yaml sections each dvc.yaml stage reads (besides `paths`, which dvc.yaml interpolates).
STAGE_SECTIONS = {
    "download": ("download", "sample", "extract.mode", "extract.folder"),  # folder mode: no archive, the tree's stat
    "verify": ("verify",),
    "extract": ("extract",),
    "convert": ("convert",),
    "curate": ("curate",),
    "validate": ("validate",),
}
SECTIONS: dict[str, type[Section]] = {
    "paths": PathsParams,
    "sample": SampleParams,
    "download": DownloadParams,
    "verify": VerifyParams,
    "extract": ExtractParams,
    "convert": ConvertParams,
    "validate": ValidateParams,
    "curate": CurateParams,
}
NESTED: dict[str, type[Section]] = {"extract.holdout": HoldoutParams}  # mappings inside a section


def output_keys(section: str) -> list[str]:
    """The keys of a section that change what a stage writes (all but the `speed_only` ones)."""
    fields = SECTIONS[section].model_fields
    return [key for key, info in fields.items() if not _speed_only(info)]


def _speed_only(info: FieldInfo) -> bool:
    extra = info.json_schema_extra  # a dict here (SPEED_ONLY); pydantic also allows a callable
    return isinstance(extra, dict) and bool(extra.get("speed_only"))


def dvc_params(stage: str) -> list[str]:
    """What dvc.yaml lists as `params:` for `stage`: a whole section, or its output keys when some are speed-only."""
    listed: list[str] = []
    for section in STAGE_SECTIONS[stage]:
        if "." in section:  # one key of another section
            listed.append(section)
            continue
        keys = output_keys(section)
        listed += [section] if keys == list(SECTIONS[section].model_fields) else [f"{section}.{k}" for k in keys]
    return listed


# ---------------------------------------------------------------- problems, named by key
def describe(schema: dict[str, Any]) -> str:
    """What a JSON schema accepts, in words: `an integer in [1, 100]`, `one of passthrough, reencode`, ..."""
    options = schema.get("anyOf", [])
    if {option.get("type") for option in options} == {"integer", "number"}:  # int | float: a number
        schema = {**{k: v for k, v in schema.items() if k != "anyOf"}, "type": "number"}
    elif options:
        return " or ".join(describe(option) for option in options)
    if "enum" in schema:
        return "one of " + ", ".join(str(v) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array" and "minItems" in schema and schema.get("minItems") == schema.get("maxItems"):
        return f"a list of {schema['minItems']} values"
    words = {
        "integer": "an integer",
        "number": "a number",
        "boolean": "true or false",
        "null": "null",
        "string": "text",
        "array": "a list",
        "object": "a mapping",
    }.get(str(kind), "a value")
    low, high = schema.get("minimum", schema.get("ge")), schema.get("maximum", schema.get("le"))
    above = schema.get("exclusiveMinimum", schema.get("gt"))
    below = schema.get("exclusiveMaximum")
    if above is not None:
        return f"{words} > {above}" + (f" and <= {high}" if high is not None else f" and < {below}" if below else "")
    if low is not None and high is not None:
        return f"{words} in [{low}, {high}]"
    if low is not None:
        return f"{words} >= {low}"
    return f"{words} <= {high}" if high is not None else words


def _owner(loc: list[str]) -> tuple[type[BaseModel] | None, str]:
    """The model holding the key an error is about, and that key (`extract.holdout.fraction`: HoldoutParams)."""
    nested = NESTED.get(".".join(loc[:2]))
    if nested is not None and len(loc) > 2:
        return nested, loc[2]
    return SECTIONS.get(loc[0]), loc[1]


def _expected(model: type[BaseModel] | None, key: str) -> str:
    """A key's description when it is free text or a mapping (what it may hold), else what its type accepts."""
    if model is None or key not in model.model_fields:
        return "a value"
    schema = model.model_json_schema()["properties"][key]
    options = [option.get("type", "object" if "$ref" in option else None) for option in schema.get("anyOf", [schema])]
    if "description" in schema and {"string", "array", "object"} & set(options) and "enum" not in schema:
        description: str = schema["description"]
        return description + (" or null" if "null" in options else "")
    return describe(schema)


def _problem(error: Any) -> str:
    loc = [str(p) for p in error["loc"]]
    where = ".".join(loc)
    kind, found = error["type"], error.get("input")
    if not loc:  # a rule across sections (Params): its message names the key
        return str(error["msg"]).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        known = list(SECTIONS) if len(loc) == 1 else list((_owner(loc[:-1] + ["", ""])[0] or Section).model_fields)
        close = difflib.get_close_matches(loc[-1], known, n=1)
        return f"{where}: unknown key" + (f" (did you mean {close[0]}?)" if close else f" (expected one of {known})")
    if kind == "missing":
        return f"{where}: missing; expected {_expected(*_owner(loc)) if len(loc) > 1 else 'a section'}"
    if kind == "value_error":
        text = str(error["msg"]).removeprefix("Value error, ")
        return f"{where}.{text}" if len(loc) == 1 else f"{where}: {text}"
    if len(loc) == 1:
        return f"{where}: expected a mapping of keys, found {found!r}"
    return f"{where}: expected {_expected(*_owner(loc))}, found {found!r}"


def validate_params(doc: Any, where: str | os.PathLike[str] = "params.yaml", root: Path | None = None) -> Params:
    """The typed params of a parsed params.yaml document, or one PipelineError listing every problem; with `root`
    (the project, params.yaml's directory) an absolute `paths:` entry is also checked to lie inside it."""
    if not isinstance(doc, dict):
        raise PipelineError(
            f"{where}: expected a mapping of sections ({', '.join(SECTIONS)}), found "
            f"{type(doc).__name__}; restore params.yaml from git (`git checkout params.yaml`)"
        )
    try:
        return Params.model_validate(doc, context={"root": root})
    except ValidationError as err:
        problems = sorted(dict.fromkeys(_problem(e) for e in err.errors()))
    raise PipelineError(
        f"{where}: {len(problems)} problem(s); fix them and run again (the comments in params.yaml "
        "say what each key takes):\n" + "\n".join(f"  - {p}" for p in problems)
    )


@dataclass(frozen=True)
class Project:
    """The validated params and the project root: every relative path in params.yaml resolves against `root`."""

    root: Path
    params: Params

    def path(self, key: str) -> Path:
        """A `paths:` entry as an absolute path."""
        return self.resolve(getattr(self.params.paths, key))

    @property
    def paths(self) -> dict[str, Path]:
        return {key: self.path(key) for key in PathsParams.model_fields}

    def resolve(self, value: str | os.PathLike[str]) -> Path:
        """A path given in params.yaml (or the run form): `~` expanded, relative ones against the project root."""
        return resolve_path(self.root, value)


def resolve_path(root: Path, value: str | os.PathLike[str]) -> Path:
    """How every path in params.yaml resolves, in every stage: `~` expanded, a relative path against `root`."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else root / path


def load_project(params_file: str | os.PathLike[str] = "params.yaml") -> Project:
    """Read and validate params.yaml whole (before any work starts); an unchanged file is read only once."""
    file = Path(params_file).resolve()
    try:
        st = file.stat()
    except FileNotFoundError:
        raise PipelineError(
            f"{params_file}: expected the project's params.yaml, found no such file; run from the "
            "project directory (where dvc.yaml is)"
        ) from None
    return _load(file, st.st_mtime_ns, st.st_size, str(params_file))


@functools.lru_cache(maxsize=8)
def _load(file: Path, _mtime_ns: int, _size: int, shown: str) -> Project:
    return Project(file.parent, validate_params(read_yaml(file, shown), shown, file.parent))


def read_yaml(file: Path, shown: str) -> Any:
    """params.yaml parsed: UTF-8, valid YAML, each key once per mapping (YAML's loaders keep the last of two
    silently); any other is one PipelineError naming the file, and the line or key."""
    try:
        data = file.read_bytes()
    except OSError as err:
        raise PipelineError(f"{shown}: expected the project's params.yaml, found: {err}; restore it from git") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise PipelineError(
            f"{shown}:{line}: expected UTF-8 text, found the bytes {data[err.start : err.end]!r}; save the file as "
            "UTF-8 (or restore it from git: `git checkout params.yaml`)"
        ) from None
    loader = yaml.SafeLoader(text)
    try:  # one parse: the node tree checked for repeated keys, then built into Python values
        node = loader.get_single_node()
        _no_duplicate_keys(node, shown, "")
        return None if node is None else loader.construct_document(node)
    except yaml.YAMLError as err:
        raise PipelineError(f"{shown}: expected valid YAML, found: {err}; fix the file") from None
    finally:
        loader.dispose()


def _no_duplicate_keys(node: yaml.Node | None, shown: str, where: str) -> None:
    """Every mapping of the document holds each key once (a second `quality:` would silently win)."""
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _no_duplicate_keys(item, shown, where)
    if not isinstance(node, yaml.MappingNode):
        return
    first: dict[str, int] = {}
    for key, value in node.value:
        name = f"{where}{key.value}" if isinstance(key, yaml.ScalarNode) else f"{where}{key.start_mark.line + 1}"
        line = key.start_mark.line + 1
        if name in first:
            raise PipelineError(
                f"{shown}:{line}: {name}: expected each key once, found it again (first at line {first[name]}; YAML "
                "keeps the last silently); delete one of the two"
            )
        first[name] = line
        _no_duplicate_keys(value, shown, f"{name}.")
