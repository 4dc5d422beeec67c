"""The validation checks: pandera schemas over the metadata columns, and dataset-level checks.

Every check yields a `CheckResult` (pass / warn / fail, a one-line message, up to N example rows), so the report
lists what was checked, not only what failed."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pandera.pandas as pa

from imagenet_parquet.format import FIELDS, HASH_ALGORITHM, TRANSFORM_PATTERN, FormatError, hf_features, own_label_map

DESCRIPTIONS = {
    "shard_schema": "every shard has the contract's columns, in order, with the contract's Arrow types",
    "schema_metadata": "every shard carries `huggingface` and `imagenet_parquet` schema metadata naming its "
    "split and the label map of label_map.json (train and val share one label map)",
    "column_types": "metadata columns have the contract's types (pandera)",
    "not_null": "no nulls in the metadata columns (pandera)",
    "label_in_range": "label is in 0..K-1 (pandera)",
    "wnid_matches_label": "wnid is the label map's wnid for the row's label (pandera)",
    "name_matches_label": "label_name is the label map's name for the row's label (pandera)",
    "unique_image_paths": "image.path is unique within a class (label) of a split (pandera)",
    "positive_size": "width and height are > 0 (pandera)",
    "sha256_hex": "sha256 is 64 lower-case hex digits (pandera)",
    "exif_orientation_range": "exif_orientation is 1..8 (pandera)",
    "transform_values": "transform is `none` or `+`-joined known steps (pandera)",
    "overlay_matches_shards": "each split's curation overlay (paths.overlay, the curate stage) was made for exactly "
    "these shards (names, row counts, footer SHA-256) and is intact; class_set, class_counts, leakage, "
    "near_duplicates and the decode sample see the merged view (labels now, excluded images dropped)",
    "class_set": "train and val hold the same classes: every class of the label map (val held out of train by "
    "params extract.holdout: a class with no val image warns)",
    "class_counts": "images per class within params validate.train_count / val_count",
    "manifest_totals": "rows per split = manifest rows - quarantined images (bad_images.jsonl), same images",
    "labels_match_manifest": "each image's label equals its label in the manifest",
    "jpeg_soi": "stored bytes start with the JPEG SOI marker FF D8",
    "sha256_match": "SHA-256 of the stored bytes equals the `sha256` column",
    "image_index": "the footer's byte index (`imagenet_parquet.image_offsets`) points at each row's exact "
    "image.bytes (what the reader preads)",
    "decode": "Pillow decodes the sampled rows to width x height",
    "leakage": "no identical image bytes (sha256) in both train and val",
    "near_duplicates": "no train/val pair of near-identical pictures (`phash` within params "
    "validate.near_duplicates_distance bits)",
}
EXAMPLE_COLUMNS = ["split", "shard", "row", "image_path", "label", "wnid", "label_name"]
_PANDERA_BUILTINS = {
    "not_nullable": "not_null",
    "field_uniqueness": "unique_image_paths",
    "column_in_dataframe": "column_types",
}
_FOCUS = {"unique_image_paths": "image_path"}  # the column a dataframe-wide check is about
_LABEL_MAP_COLUMNS = {"wnid_matches_label": ("wnid", "wnid"), "name_matches_label": ("label_name", "name")}


@dataclass
class CheckResult:
    name: str
    status: str  # "pass" | "warn" | "fail"
    message: str
    failures: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "description": DESCRIPTIONS[self.name]}


def passed(name: str, message: str = "ok") -> CheckResult:
    return CheckResult(name, "pass", message)


def example_rows(
    meta: pd.DataFrame, index: list[int], limit: int, detail: dict[int, str] | None = None, column: str = "found"
) -> list[dict[str, Any]]:
    """Up to `limit` rows of the metadata frame (JSON-ready), each with what was found for it."""
    rows = []
    for i in sorted(index)[:limit]:
        row = {c: _plain(meta.at[i, c]) for c in EXAMPLE_COLUMNS if c in meta}
        if detail is not None:
            row[column] = _plain(detail[i])
        rows.append(row)
    return rows


def _plain(value: Any) -> Any:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def row_failures(name: str, meta: pd.DataFrame, found: dict[int, str], limit: int, what: str) -> CheckResult:
    """A check failing per row (byte checks): fail when any row is in `found`."""
    if not found:
        return passed(name, f"all {what} ok")
    first = min(found)
    return CheckResult(
        name,
        "fail",
        f"{len(found)} row(s): {DESCRIPTIONS[name]} — e.g. "
        f"{meta.at[first, 'split']} {meta.at[first, 'image_path']!r}: {found[first]}",
        len(found),
        example_rows(meta, list(found), limit, found),
    )


# ---------------------------------------------------------------- Arrow schema and metadata (per shard)
def shard_schema_check(
    files: list[tuple[str, Path, Any]],
    label_map: dict[str, Any],
    limit: int,
    own: list[dict[str, Any]] | None = None,
) -> list[CheckResult]:
    """Arrow types/order and the schema metadata of every shard (split, path, Arrow schema), against the contract
    and label_map.json — or, `own` given (appended shards, issue 33: each with the label map current when it was
    written, a format-2 overlay giving the labels now), each shard's own label map, one per file."""
    expected = [(name, str(dtype)) for name, dtype in FIELDS]
    maps = own if own is not None else [label_map] * len(files)
    bad_types, bad_meta = [], []
    seen: dict[tuple[str, bytes | None, bytes | None], str | None] = {}  # a split's shards share one metadata
    for (split, path, schema), expected_map in zip(files, maps, strict=True):
        found = [(f.name, str(f.type)) for f in schema]
        if found != expected:
            bad_types.append({"split": split, "shard": path.name, "found": _diff(expected, found)})
        metadata = schema.metadata or {}
        key = (split, metadata.get(b"imagenet_parquet"), metadata.get(b"huggingface"))
        if key not in seen:
            seen[key] = _metadata_problem(metadata, split, expected_map)
        problem = seen[key]
        if problem:
            bad_meta.append({"split": split, "shard": path.name, "found": problem})
    return [
        _shard_result(
            "shard_schema",
            bad_types,
            limit,
            "expected the columns and Arrow types of docs/CONTRACTS.md; re-run the convert stage",
        ),
        _shard_result("schema_metadata", bad_meta, limit, "re-run the convert stage with this label map"),
    ]


def _diff(expected: list[tuple[str, str]], found: list[tuple[str, str]]) -> str:
    missing = [f"{n}: {t}" for n, t in expected if (n, t) not in found]
    extra = [f"{n}: {t}" for n, t in found if (n, t) not in expected]
    if not missing and not extra:
        return f"columns in another order: {[n for n, _ in found]}"
    return f"missing/mistyped {missing}; unexpected {extra}"


def _metadata_problem(metadata: dict[bytes, bytes], split: str, label_map: dict[str, Any]) -> str | None:
    keys = {k.decode() for k in metadata}
    if not {"huggingface", "imagenet_parquet"} <= keys:
        return f"schema metadata keys {sorted(keys)}, no `huggingface` / `imagenet_parquet`"
    try:
        own = json.loads(metadata[b"imagenet_parquet"])
        features = json.loads(metadata[b"huggingface"]).get("info", {}).get("features", {})
    except (ValueError, AttributeError) as err:
        return f"schema metadata that is not the expected JSON ({err})"
    if own.get("hash_algorithm") != HASH_ALGORITHM:
        return f"imagenet_parquet.hash_algorithm is {own.get('hash_algorithm')!r}, expected {HASH_ALGORITHM!r}"
    if own.get("split") != split:
        return f"imagenet_parquet.split is {own.get('split')!r} in the {split} directory"
    try:
        stored = own_label_map(metadata, split)  # format 5: without the names, which the ClassLabel holds
    except FormatError as err:
        return f"imagenet_parquet.label_map that cannot be read back ({err})"
    if stored != label_map:
        return "imagenet_parquet.label_map differs from label_map.json (train and val must share one label map)"
    expected = hf_features([c["name"] for c in label_map["classes"]])["info"]["features"]
    if features.get("label") != expected["label"]:
        return "huggingface ClassLabel names differ from the label map's names"
    return None


def _shard_result(name: str, bad: list[dict[str, Any]], limit: int, hint: str) -> CheckResult:
    if not bad:
        return passed(name, "all shards ok")
    first = bad[0]
    return CheckResult(
        name,
        "fail",
        f"{len(bad)} shard(s): {first['split']}/{first['shard']}: {first['found']}; {hint}",
        len(bad),
        bad[:limit],
    )


# ---------------------------------------------------------------- pandera over the metadata columns
def metadata_schema(label_map: dict[str, Any]) -> pa.DataFrameSchema:
    """The pandera schema of the metadata columns, with the label map's classes built in."""
    classes = label_map["classes"]
    wnids = pd.Series({c["label"]: c["wnid"] for c in classes}, dtype=object)
    names = pd.Series({c["label"]: c["name"] for c in classes}, dtype=object)
    positive = pa.Check.gt(0, error="positive_size")
    return pa.DataFrameSchema(
        {
            "image_path": pa.Column(str),
            "label": pa.Column("int64", pa.Check.in_range(0, len(classes) - 1, error="label_in_range")),
            "wnid": pa.Column(str, nullable=True),  # null: a dataset not named by wnids
            "label_name": pa.Column(str),
            "width": pa.Column("int32", positive),
            "height": pa.Column("int32", positive),
            "source_format": pa.Column(str),
            "transform": pa.Column(str, pa.Check.str_matches(TRANSFORM_PATTERN, error="transform_values")),
            "exif_orientation": pa.Column("int8", pa.Check.in_range(1, 8, error="exif_orientation_range")),
            "sha256": pa.Column(str, pa.Check.str_matches(r"^[0-9a-f]{64}$", error="sha256_hex")),
        },
        checks=[
            pa.Check(lambda df: _same(df["wnid"], df["label"].map(wnids)), error="wnid_matches_label"),
            pa.Check(lambda df: df["label_name"] == df["label"].map(names), error="name_matches_label"),
            pa.Check(
                lambda df: ~df.duplicated(["split", "label", "image_path"], keep=False), error="unique_image_paths"
            ),
        ],
        strict=False,
    )


def _same(found: pd.Series, expected: pd.Series) -> pd.Series:
    """Equal, or both null (a dataset not named by wnids)."""
    return (found == expected) | (found.isna() & expected.isna())


def pandera_checks(meta: pd.DataFrame, label_map: dict[str, Any], limit: int) -> list[CheckResult]:
    """Lazy pandera validation; failure cases grouped into one CheckResult per check, with example rows."""
    try:
        metadata_schema(label_map).validate(meta, lazy=True)
        cases = pd.DataFrame(columns=["check", "column", "failure_case", "index"])
    except pa.errors.SchemaErrors as err:
        cases = err.failure_cases
    cases = cases.assign(name=cases["check"].map(_check_name))
    results = []
    for name in [n for n in DESCRIPTIONS if "(pandera)" in DESCRIPTIONS[n]]:
        group = cases[cases["name"] == name]
        results.append(_pandera_result(name, group, meta, limit, label_map) if len(group) else passed(name))
    return results


def _check_name(check: str) -> str:
    if check.startswith("dtype("):
        return "column_types"
    return _PANDERA_BUILTINS.get(check, check)


def _label_map_details(name: str, index: list[int], meta: pd.DataFrame, label_map: dict[str, Any]) -> dict[int, str]:
    column, key = _LABEL_MAP_COLUMNS[name]
    by_label = {c["label"]: c[key] for c in label_map["classes"]}
    return {
        i: f"{column} {meta.at[i, column]!r}, but label_map.json has {key} "
        f"{by_label.get(_plain(meta.at[i, 'label']))!r} for label {_plain(meta.at[i, 'label'])}"
        for i in index
    }


def _pandera_result(
    name: str, group: pd.DataFrame, meta: pd.DataFrame, limit: int, label_map: dict[str, Any]
) -> CheckResult:
    rows = group.dropna(subset=["index"])
    if rows.empty:  # a whole column missing or mistyped: no row to point at
        found = sorted({f"{c}: {v}" for c, v in zip(group["column"], group["failure_case"], strict=True)})
        return CheckResult(
            name, "fail", f"{DESCRIPTIONS[name]} — found {found}", len(group), [{"found": f} for f in found[:limit]]
        )
    if name in _LABEL_MAP_COLUMNS:
        detail = _label_map_details(name, sorted(set(rows["index"].astype(int))), meta, label_map)
    else:
        focus = rows[rows["column"] == _FOCUS.get(name)]
        rows, detail = (focus if len(focus) else rows), {}
        for index, column, value in zip(rows["index"].astype(int), rows["column"], rows["failure_case"], strict=True):
            detail.setdefault(index, f"{column} = {_plain(value)!r}")
    first = min(detail)
    message = (
        f"{len(detail)} row(s): {DESCRIPTIONS[name]} — e.g. {meta.at[first, 'split']} "
        f"{meta.at[first, 'image_path']!r}: {detail[first]}"
    )
    return CheckResult(name, "fail", message, len(detail), example_rows(meta, list(detail), limit, detail))
