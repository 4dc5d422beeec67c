"""The Parquet shard format: the one contract the convert stage (writer) and the reader share.

Columns and Arrow types, the schema metadata (`huggingface` features and the project's own `imagenet_parquet`
key, whose label map leaves the class names to the former), the `transform` vocabulary, the per-row byte index in
the footer (encode and decode), and reading the label map (from `label_map.json` or from a shard's metadata). Needs
only pyarrow and numpy. Described in words in docs/CONTRACTS.md; bump `FORMAT_VERSION` when the bytes written for
the same inputs change."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

FORMAT_VERSION = 6  # 2: byte index; 3: `phash`; 4: rows in `order`; 5: no ARROW:schema, label map by field;
# 6: `curation` (overlay: labels and membership come from the curation overlay beside the shards, overlay.py)
GENERATION_KEY = "generation"  # own metadata of a shard appended after the first conversion: 1, 2, ... (absent: 0)
HASH_ALGORITHM = "sha256"
FINGERPRINT_COLUMN = "phash"
FINGERPRINT_ALGORITHM = "dct64-v2"  # tasks/convert/fingerprint.py; changes when its bits for the same bytes do
IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # the Hugging Face Image layout
FIELDS: list[tuple[str, pa.DataType]] = [
    ("image", IMAGE_TYPE),
    ("label", pa.int64()),
    ("wnid", pa.string()),
    ("label_name", pa.string()),
    ("width", pa.int32()),
    ("height", pa.int32()),
    ("source_format", pa.string()),
    ("transform", pa.string()),
    ("exif_orientation", pa.int8()),
    (HASH_ALGORITHM, pa.string()),
    (FINGERPRINT_COLUMN, pa.uint64()),
]
COLUMNS = [name for name, _ in FIELDS]
# Parquet column paths (nested image columns are dotted): JPEG bytes are stored PLAIN and uncompressed (the byte
# index relies on it), the rest is compressed.
UNCOMPRESSED_COLUMNS = ["image.bytes"]
SMALL_COLUMNS = ["image.path", *COLUMNS[1:]]
METADATA_KEY = b"imagenet_parquet"
HF_METADATA_KEY = b"huggingface"
LABEL_MAP_KEYS = (METADATA_KEY, HF_METADATA_KEY)  # the metadata a shard's label map (and generation) is read from
CLASS_FIELDS = "class_fields"  # label_map: one list per class field, no names (stored_label_map)
IMAGE_INDEX_KEY = "imagenet_parquet.image_offsets"  # per-row (offset, size) of image.bytes, in the footer
# Every `transform` value is `none` or these steps joined by `+`.
TRANSFORM_STEP_PATTERN = (
    r"[a-z0-9]+_to_jpeg|cmyk_to_rgb|to_rgb|exif_transpose|resize_[0-9]+|max_side_[0-9]+|reencode_q[0-9]+"
)
TRANSFORM_PATTERN = rf"^(none|({TRANSFORM_STEP_PATTERN})(\+({TRANSFORM_STEP_PATTERN}))*)$"
_VALUE_DTYPES = {
    pa.int8(): "int8",
    pa.int32(): "int32",
    pa.int64(): "int64",
    pa.string(): "string",
    pa.uint64(): "uint64",
}


class FormatError(ValueError):
    """Data that breaks the format; the message names the file, what was expected, what was found, what to do."""


# ---------------------------------------------------------------- label map
def class_names(label_map: dict[str, Any]) -> list[str]:
    """ClassLabel names in label order (label map `name`), checked to be 0..K-1 and unique."""
    classes = label_map.get("classes") or []
    labels = [c.get("label") for c in classes]
    if labels != list(range(len(classes))) or len(classes) != label_map.get("num_classes"):
        raise FormatError(
            "label map: expected `classes` with labels 0..num_classes-1 in order, found labels "
            f"{labels[:5]}... for num_classes={label_map.get('num_classes')}; re-run the extract stage"
        )
    names = [c["name"] for c in classes]
    if len(set(names)) != len(names):
        raise FormatError(
            "label map: expected unique class names (ClassLabel), found duplicates; re-run the extract stage"
        )
    return names


def class_ids(label_map: dict[str, Any]) -> list[str]:
    """The classes as the source names them, in label order — what torchvision's ImageFolder calls `classes`:
    the wnid of a WordNet-named dataset, the folder name (`name`) of any other (its `wnid` is null)."""
    return [c.get("wnid") or c["name"] for c in sorted(label_map.get("classes") or [], key=lambda c: c["label"])]


def read_label_map(path: str | os.PathLike[str]) -> dict[str, Any]:
    """`data/label_map.json` (written by the extract stage), checked to hold labels 0..K-1 with unique names."""
    path = Path(path)
    if not path.is_file():
        raise FormatError(
            f"{path}: expected the label map written by the extract stage, found no file; run `dvc repro extract` "
            "(or `dvc pull data/label_map.json`)"
        )
    try:
        label_map: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise FormatError(f"{path}: expected the label map JSON, found: {err}; re-run the extract stage") from None
    class_names(label_map)
    return label_map


def _metadata_json(meta: dict[bytes, bytes] | None, key: bytes) -> dict[str, Any] | None:
    if not meta or key not in meta:
        return None
    value: dict[str, Any] = json.loads(meta[key])
    return value


def own_metadata(meta: dict[bytes, bytes] | None) -> dict[str, Any] | None:
    """The project's `imagenet_parquet` schema metadata (label map, convert params, split), when present."""
    return _metadata_json(meta, METADATA_KEY)


def shard_generation(meta: dict[bytes, bytes] | None) -> int:
    """The generation a shard was appended in (GENERATION_KEY of its own metadata): 0 for a canonical shard."""
    value = (own_metadata(meta) or {}).get(GENERATION_KEY, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def hf_class_names(meta: dict[bytes, bytes] | None) -> list[str] | None:
    """The Hugging Face ClassLabel names (`huggingface` metadata), in label order, when present."""
    hf = _metadata_json(meta, HF_METADATA_KEY)
    names: list[str] | None = (((hf or {}).get("info") or {}).get("features") or {}).get("label", {}).get("names")
    return names


def own_label_map(meta: dict[bytes, bytes] | None, where: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The label map of a shard's `imagenet_parquet` metadata, whole (as label_map.json), or None when it has none.

    Format 5 stores it without the class names and with one list per other field (`stored_label_map`); older
    shards store it whole."""
    ours = own_metadata(meta)
    stored = ours.get("label_map") if ours else None
    if not isinstance(stored, dict):
        return None
    if CLASS_FIELDS not in stored:
        return stored
    return _whole_label_map(stored, hf_class_names(meta) or [], where)


def label_map_from_metadata(meta: dict[bytes, bytes] | None, where: str | os.PathLike[str]) -> dict[str, Any]:
    """The label map stored in a shard's schema metadata (`imagenet_parquet` -> `label_map`).

    Falls back to the Hugging Face ClassLabel names (`huggingface` metadata) for shards written by others."""
    ours = own_label_map(meta, where)
    if ours is not None:
        return ours
    names = hf_class_names(meta)
    if names:
        return {
            "num_classes": len(names),
            "label_source": "huggingface",
            "classes": [{"label": i, "name": n} for i, n in enumerate(names)],
        }
    raise FormatError(
        f"{where}: expected schema metadata '{METADATA_KEY.decode()}' with a 'label_map' (or Hugging Face "
        f"ClassLabel names), found keys {sorted(k.decode() for k in (meta or {}))}; pass label_map= explicitly "
        "(e.g. data/label_map.json)"
    )


def stored_label_map(label_map: dict[str, Any]) -> dict[str, Any]:
    """The label map as a shard's `imagenet_parquet` metadata holds it: no class names (the `huggingface` ClassLabel
    names hold them, in label order) and one list per other class field (`class_fields`) instead of one dict per
    class. At 19,000 classes ~0.7 MB instead of ~1.9 MB in every footer. A label map whose classes do not all have
    the same fields is stored whole (a missing field and a null one read back differently)."""
    classes = label_map.get("classes") or []
    keys = sorted({key for c in classes for key in c} - {"label", "name"})
    if any(len(c) != len(keys) + 2 for c in classes):
        return label_map
    rest = {key: value for key, value in label_map.items() if key != "classes"}
    return {**rest, CLASS_FIELDS: {key: [c[key] for c in classes] for key in keys}}


def _whole_label_map(stored: dict[str, Any], names: list[str], where: str | os.PathLike[str]) -> dict[str, Any]:
    fields = stored[CLASS_FIELDS]
    lengths = (
        {k: len(v) if isinstance(v, list) else None for k, v in fields.items()} if isinstance(fields, dict) else {}
    )
    if not isinstance(fields, dict) or any(n != len(names) for n in lengths.values()):
        raise FormatError(
            f"{where}: expected '{METADATA_KEY.decode()}' label_map.{CLASS_FIELDS} lists as long as the "
            f"{len(names)} Hugging Face ClassLabel names, found lengths {lengths or type(fields).__name__}; "
            "the footer was altered after conversion — re-run the convert stage"
        )
    classes = [{"label": label, "name": name} for label, name in enumerate(names)]
    for key, values in fields.items():
        for entry, value in zip(classes, values, strict=True):
            entry[key] = value
    rest = {key: value for key, value in stored.items() if key != CLASS_FIELDS}
    return {**rest, "classes": classes}


# ---------------------------------------------------------------- schema
def hf_features(names: list[str]) -> dict[str, Any]:
    """The `huggingface` metadata value, in the exact form `datasets` writes and reads back."""
    features: dict[str, Any] = {"image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"}}
    for name, dtype in FIELDS[2:]:
        features[name] = {"dtype": _VALUE_DTYPES[dtype], "_type": "Value"}
    return {"info": {"features": features}}


def shard_schema(
    label_map: dict[str, Any],
    params: dict[str, Any],
    split: str,
    fingerprinted: bool = True,
    curation: str | None = None,
    generation: int = 0,
) -> pa.Schema:
    """The explicit schema of every shard of `split`, with deterministic metadata (no timestamps).

    `fingerprinted` False: the FINGERPRINT_COLUMN is null in every row, and `fingerprint_algorithm` is null.
    `curation`: "overlay" (convert: readers take labels and membership from the overlay beside the shards and refuse
    the shards without it), "applied" (compacted shards: the labels stored are the curated ones), or None (not
    recorded: shards written by others). `generation` >= 1: a shard appended after the first conversion
    (GENERATION_KEY; generation 0 does not carry the key, so a canonical shard is what it always was)."""
    own = {
        **({"curation": curation} if curation else {}),
        **({GENERATION_KEY: generation} if generation else {}),
        "label_map": stored_label_map(label_map),
        "convert_params": params,
        "split": split,
        "hash_algorithm": HASH_ALGORITHM,
        "fingerprint_algorithm": FINGERPRINT_ALGORITHM if fingerprinted else None,
    }
    metadata = {
        "huggingface": json.dumps(hf_features(class_names(label_map))),
        "imagenet_parquet": json.dumps(own, sort_keys=True),
    }
    return pa.schema([pa.field(name, dtype) for name, dtype in FIELDS], metadata=metadata)


def footer_metadata(schema: pa.Schema) -> dict[str, str]:
    """The schema metadata as the footer's key-value pairs, each stored once: the writer stores no `ARROW:schema`
    (which would hold all of it again, base64-encoded), and readers take the schema metadata from these pairs."""
    return {key.decode(): value.decode() for key, value in (schema.metadata or {}).items()}


# ---------------------------------------------------------------- footer byte index
def encode_image_index(entries: Sequence[tuple[int, int]]) -> str:
    """The footer value of IMAGE_INDEX_KEY: base64 of little-endian int64 (offset, size) pairs, one per row."""
    return base64.b64encode(np.asarray(entries, dtype="<i8").reshape(-1, 2).tobytes()).decode("ascii")


def decode_image_index(meta: dict[bytes, bytes] | None, rows: int, where: str | os.PathLike[str]) -> np.ndarray | None:
    """The footer's per-row (offset, size) array (shape rows x 2, int64), or None when the shard has none."""
    value = (meta or {}).get(IMAGE_INDEX_KEY.encode())
    if value is None:
        return None
    index = np.frombuffer(base64.b64decode(value), dtype="<i8").reshape(-1, 2)
    if len(index) != rows:
        raise FormatError(
            f"{where}: expected {rows} entries in the footer's {IMAGE_INDEX_KEY}, found {len(index)}; "
            "the shard was altered after conversion — re-run the convert stage"
        )
    return index


def read_indexed(fd: int, entry: np.ndarray, where: str | os.PathLike[str]) -> bytes:
    """One image through the byte index: a single pread of the length prefix plus the bytes, prefix checked.

    PLAIN binary values are stored as a 4-byte little-endian length followed by the bytes; `offset` points at
    the bytes."""
    offset, size = int(entry[0]), int(entry[1])
    value = plain_value(os.pread(fd, size + 4, offset - 4), size)
    if value is None:
        raise FormatError(
            f"{where}: expected a {size}-byte image value at offset {offset} (footer {IMAGE_INDEX_KEY}), found "
            "other bytes; the shard was altered — re-run the convert stage"
        )
    return value


def plain_value(data: bytes, size: int) -> bytes | None:
    """The bytes of a PLAIN binary value (4-byte little-endian length, then the bytes) read from where the byte
    index points, when `data` is one of `size` bytes; else None."""
    if len(data) != size + 4 or int.from_bytes(data[:4], "little") != size:
        return None
    return data[4:]
