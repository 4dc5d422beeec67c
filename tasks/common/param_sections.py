"""The sections of params.yaml as typed models (one pydantic model per section, every key required, unknown keys
refused), with the value rules each key takes; `tasks/common/params.py` joins them into the whole file and loads it.

A field's `description=` is what docs/params.md and the run form say the key takes; keys marked `speed_only`
change how fast a stage runs, never what it writes (dvc.yaml leaves them out of the stage's params)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from tasks.common.param_rules import CURATION_PATTERN, JsonPattern, curation_file, in_project, secrets_in

SPEED_ONLY: JsonDict = {"speed_only": True}


class Section(BaseModel):
    """One section of params.yaml: every key required (params.yaml is the one place values are stated)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _needs(section: Section, when: str, value: str, key: str, expected: str) -> None:
    """A cross-field rule: with `when: value`, `key` must be set (raised as `key: expected ..., found null`)."""
    if getattr(section, when) == value and not getattr(section, key):
        raise ValueError(f"{key}: expected {expected} with {when}: {value}, found null")


# Every `paths:` entry: non-empty, inside the project (rules as data: the annotation, checked by pydantic).
ProjectPath = Annotated[str, Field(min_length=1), AfterValidator(in_project)]


class PathsParams(Section):
    raw: ProjectPath = Field(description="a directory: downloaded / linked archives")
    manifests: ProjectPath = Field(description="a directory: per-split manifests (extract)")
    label_map: ProjectPath = Field(description="a file: the label map (extract)")
    parquet: ProjectPath = Field(description="a directory: the shards (convert)")
    work: ProjectPath = Field(description="a directory: scratch space, resume state (not tracked)")
    metrics: ProjectPath = Field(description="a directory: DVC metrics JSON per stage")
    reports: ProjectPath = Field(description="a directory: reports (validate)")
    versions: ProjectPath = Field(description="a directory tracked in git: the version index (validate)")
    overlay: ProjectPath = Field(
        description="a directory: the curation overlay per split (curate); beside parquet, named overlay"
    )

    @model_validator(mode="after")
    def _overlay_beside_parquet(self) -> PathsParams:
        wanted = (Path(self.parquet).parent / "overlay").as_posix()
        if Path(self.overlay).as_posix() != wanted:
            raise ValueError(
                f"overlay: expected {wanted} (readers find a split's overlay at <parquet>/../overlay/<split>.parquet), "
                f"found {self.overlay}"
            )
        return self


def path_key(name: str) -> str:
    """The params.yaml key of a `paths:` entry (`paths.reports`), as messages name it (a KeyError for no entry)."""
    if name not in PathsParams.model_fields:
        raise KeyError(f"paths.{name}")
    return f"paths.{name}"


class SampleParams(Section):
    classes: int = Field(ge=1, le=1000, description="classes in the built-in sample (real ILSVRC2012 wnids)")
    train_per_class: int = Field(ge=1, le=1300, description="images per class, at most ILSVRC2012's 1300")
    val_per_class: int = Field(ge=1, le=50, description="images per class, at most ILSVRC2012's 50")
    seed: int = Field(ge=0, description="the seed the sample's images are drawn from (same seed: same bytes)")


Text = Annotated[str, Field(min_length=1)]


class DownloadParams(Section):
    source: Text = Field(description="sample | a directory | a URL prefix (file://, http(s)://, s3://)")
    train: Text | None = Field(description="a path or URL of this archive (null: <source>/<official name>)")
    val: Text | None = Field(description="a path or URL of this archive (null: <source>/<official name>)")
    devkit: Text | None = Field(description="a path or URL of this archive (null: <source>/<official name>)")
    archive: Text | None = Field(
        description="the ImageNet-21k archive (extract.mode: archive21k): a file name under download.source, or a "
        "path or URL; .tar, .tar.gz or .tgz (null: ILSVRC2012's three archives)"
    )
    retries: int = Field(
        ge=0, le=1000, description="attempts after a failed one, each resuming with Range", json_schema_extra=SPEED_ONLY
    )
    backoff_s: float = Field(
        ge=0, le=3600, description="first retry delay in seconds, doubled each retry", json_schema_extra=SPEED_ONLY
    )
    timeout_s: float = Field(
        gt=0,
        le=86400,
        description="connect / read timeout: a longer stall is a failed attempt",
        json_schema_extra=SPEED_ONLY,
    )
    chunk_mb: float = Field(gt=0, le=1024, description="read / write / hash block in MB", json_schema_extra=SPEED_ONLY)

    @field_validator("source", "train", "val", "devkit", "archive")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        """params.yaml is committed and DVC copies these values into dvc.lock: a URL carries no secret (user info,
        a signed or token query)."""
        found = secrets_in(value) if value else None
        if found:
            raise ValueError(
                "expected a URL without user info (user:password@) or a signed / token query (X-Amz-Signature=, "
                f"Signature=, sig=, token=, ...), found {found}; params.yaml and dvc.lock are committed. Put the "
                "credentials in ~/.netrc (HTTP), the environment (AWS_ACCESS_KEY_ID / AWS_PROFILE with the plain "
                "s3:// URL instead of a pre-signed one) or the fsspec config (FSSPEC_S3_* variables)"
            )
        return value

    @field_validator("archive")
    @classmethod
    def _tar_suffix(cls, value: str | None) -> str | None:
        if value is not None and not value.lower().endswith(ARCHIVE_SUFFIXES):
            raise ValueError(f"expected a file ending in {', '.join(ARCHIVE_SUFFIXES)}, found {value!r}")
        return value


ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")  # download.archive: a tar, or a gzipped one (decompressed once)


class VerifyParams(Section):
    checksums: Text = Field(description="auto | official | sample | a name<TAB>md5 table")


class HoldoutParams(Section):
    """A val split held out of train for a source that ships none: an image is val when a keyed hash of its class
    and name (folder mode; archive21k: of its name; keyed with `seed`) falls below `fraction` — a decision about that
    image alone, so adding, removing or relabelling other images never moves it between train and val."""

    fraction: float = Field(gt=0, lt=1, description="the share of each class's images held out as val")
    seed: int = Field(ge=0, le=(1 << 63) - 1, description="the key of the name hash (another seed: another split)")


class ExtractParams(Section):
    mode: Literal["archives", "folder", "archive21k"] = Field(
        description="archives: ILSVRC2012's three archives | folder: a train/<class>, val/<class> tree | "
        "archive21k: one tar of per-class <wnid>.tar (download.archive)"
    )
    folder: Text | None = Field(description="root of the train/<class>, val/<class> tree (folder mode)")
    classes: Text = Field(description="all | imagenet100 | a file with one class name per line")
    val_labels: Text = Field(description="devkit | a filename,wnid CSV")
    catalog: Text = Field(description="auto | derived | a wnid<TAB>words table (words of WordNet-named classes)")
    holdout: HoldoutParams | None = Field(description="a mapping {fraction: 0..1, seed: an integer >= 0}")
    materialize: bool = Field(
        description="also write an ImageFolder tree under paths.work (not a DVC out)", json_schema_extra=SPEED_ONLY
    )

    @model_validator(mode="after")
    def _folder_mode_needs_folder(self) -> ExtractParams:
        _needs(self, "mode", "folder", "folder", "the root of the train/<class>, val/<class> tree")
        if self.mode == "archives" and (self.catalog != "auto" or self.holdout is not None):
            raise ValueError(
                "catalog: expected auto and holdout: null with mode: archives (ILSVRC2012: the devkit names the "
                f"classes, the val archive is the val split), found catalog: {self.catalog}, holdout: {self.holdout}"
            )
        if self.mode == "archive21k":
            _needs(self, "mode", "archive21k", "holdout", "{fraction, seed} (the archive ships no val split)")
            if self.catalog == "auto":
                raise ValueError(
                    "catalog: expected derived (the wnids alone) or a wnid<TAB>words table with mode: archive21k "
                    "(the archive names its classes by wnid only), found auto"
                )
        return self


def _cpus_when_auto(value: Any) -> Any:
    """`auto` = the CPUs this process may run on (affinity, cgroup cpusets), resolved when params.yaml is read."""
    return len(os.sched_getaffinity(0)) if value == "auto" else value


Workers = Annotated[
    int,
    BeforeValidator(_cpus_when_auto),
    Field(ge=1, le=4096),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1, "maximum": 4096}, {"enum": ["auto"]}]}),
]


class ConvertParams(Section):
    policy: Literal["passthrough", "reencode"] = Field(
        description="passthrough: clean JPEGs stored byte for byte, only what must change re-encoded | reencode: every "
        "image re-encoded at quality"
    )
    quality: int = Field(ge=1, le=100, description="JPEG quality whenever an image is (re-)encoded")
    resize_shorter: Annotated[int, Field(ge=1, le=65536)] | None = Field(
        description="shorter side resized to this (Lanczos), never upscaled (null: no resize)"
    )
    max_side: Annotated[int, Field(ge=1, le=65536)] | None = Field(
        description="longer side bounded: larger images resized down to this (Lanczos, aspect kept) and re-encoded "
        "at quality, never upscaled (null: no bound); with resize_shorter the tighter bound applies"
    )
    exif: Literal["keep", "transpose"] = Field(
        description="keep: bytes untouched, orientation recorded in exif_orientation | transpose: pixels rotated"
    )
    full_decode: bool = Field(description="also fully decode images kept byte for byte (~10x slower)")
    shard_mb: int | float = Field(
        ge=0.001, le=1 << 20, description="target shard size in MB of input (0.5-2x)"
    )  # int stays int: it is recorded in the shards
    row_group_rows: int = Field(ge=1, le=1 << 24, description="rows per Parquet row group")
    order: Literal["hashed", "class"] = Field(
        description="hashed: rows by a keyed hash of the image name (every row group a uniform class mix) | "
        "class: sorted by class, then name (class locality)"
    )
    fingerprint: bool = Field(
        description="true: the `phash` perceptual fingerprint of every image (validate's near-duplicate check; a "
        "reduced decode, ~3x the rest of a pass-through convert's CPU) | false: `phash` null, validate reports "
        "near-duplicates as not checked"
    )
    workers: Workers = Field(description="local processes (auto: the CPUs available)", json_schema_extra=SPEED_ONLY)
    task_runner: Literal["local", "dask"] = Field(
        description="local: a pool of processes | dask: a Dask cluster at dask_address", json_schema_extra=SPEED_ONLY
    )
    dask_address: Text | None = Field(
        description="a Dask scheduler address (tcp://host:8786)", json_schema_extra=SPEED_ONLY
    )
    max_bad_fraction: float = Field(ge=0, le=1, description="fail when a split has more bad images than this fraction")
    max_image_pixels: int = Field(ge=1, le=1 << 40, description="decompression-bomb guard: larger images quarantined")

    @model_validator(mode="after")
    def _dask_needs_address(self) -> ConvertParams:
        _needs(self, "task_runner", "dask", "dask_address", "a scheduler address (tcp://host:8786)")
        return self


Count = Annotated[int, Field(ge=0)]


class ValidateParams(Section):
    train_count: list[Count] = Field(min_length=2, max_length=2, description="[min, max] images per class")
    val_count: list[Count] = Field(min_length=2, max_length=2, description="[min, max] images per class")
    decode_sample: int | float | str = Field(description='a row count (int >= 0), a fraction (0..1) or "all"')
    leakage_max_pairs: int = Field(ge=0, description="train/val pairs of identical bytes that only warn; more fail")
    report_examples: int = Field(ge=0, description="example rows shown per failed check in the report")
    contact_sheet_per_class: int = Field(ge=1, description="thumbnails per class and split on the contact sheet")
    contact_sheet_classes: int = Field(ge=1, description="classes on the contact sheet (evenly spaced labels)")
    near_duplicates_distance: int = Field(ge=0, le=16, description="Hamming distance between 64-bit fingerprints")
    near_duplicates_max_pairs: int = Field(
        ge=0, description="near-duplicate train/val pairs that only warn (at least; see the chance margin); more fail"
    )
    near_duplicates_chance_margin: float = Field(
        ge=0,
        le=1e6,
        description="pairs tolerated = max(near_duplicates_max_pairs, this x the pairs expected by chance among the "
        "train x val comparisons of unrelated uniform fingerprints); 0: near_duplicates_max_pairs alone",
    )
    near_duplicates_train_distance: int = Field(ge=0, le=8, description="Hamming distance within train")
    workers: Workers = Field(
        description="processes checking shards (auto: the CPUs available)", json_schema_extra=SPEED_ONLY
    )

    @field_validator("train_count", "val_count")
    @classmethod
    def _ordered(cls, bounds: list[int]) -> list[int]:
        if bounds[0] > bounds[1]:
            raise ValueError(f"expected [min, max] with min <= max, found {bounds}")
        return bounds

    @field_validator("decode_sample", mode="before")
    @classmethod
    def _sample(cls, value: Any) -> Any:
        if value == "all" and isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        if isinstance(value, float) and 0 <= value <= 1:
            return value
        raise ValueError(f'expected a row count (int >= 0), a fraction (0..1) or "all", found {value!r}')


# A curation file: under curation/, the curate stage's dependency in dvc.yaml (rule as data: param_rules.py).
CurationFile = Annotated[str, AfterValidator(curation_file), JsonPattern(CURATION_PATTERN)]


class CurateParams(Section):
    exclude: CurationFile | None = Field(
        description="a CSV split,wnid,name,reason of images to drop, under curation/ (null: none)"
    )
    relabel: CurationFile | None = Field(
        description="a CSV split,wnid,name,new_wnid,reason of images to move, under curation/ (null: none)"
    )
