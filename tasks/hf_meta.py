"""The Parquet shard schema (docs/CONTRACTS.md) and its metadata: `huggingface` features + the project's own."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from tasks.common import PipelineError

HASH_ALGORITHM = "sha256"
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
]
COLUMNS = [name for name, _ in FIELDS]
# Parquet column paths (nested image columns are dotted): JPEG bytes do not compress, the rest does.
UNCOMPRESSED_COLUMNS = ["image.bytes"]
SMALL_COLUMNS = ["image.path", *COLUMNS[1:]]
_VALUE_DTYPES = {pa.int8(): "int8", pa.int32(): "int32", pa.int64(): "int64", pa.string(): "string"}


def class_names(label_map: dict[str, Any]) -> list[str]:
    """ClassLabel names in label order (label map `name`), checked to be 0..K-1 and unique."""
    classes = label_map.get("classes") or []
    labels = [c.get("label") for c in classes]
    if labels != list(range(len(classes))) or len(classes) != label_map.get("num_classes"):
        raise PipelineError(
            "label map: expected `classes` with labels 0..num_classes-1 in order, found labels "
            f"{labels[:5]}... for num_classes={label_map.get('num_classes')}; re-run the extract stage")
    names = [c["name"] for c in classes]
    if len(set(names)) != len(names):
        raise PipelineError("label map: expected unique class names (ClassLabel), found duplicates; "
                            "re-run the extract stage")
    return names


def read_label_map(path: str | Path) -> dict[str, Any]:
    """data/label_map.json (written by the extract stage), checked to hold labels 0..K-1 with unique names."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: expected the label map written by the extract stage, found no file; "
                            "run `dvc repro extract`")
    try:
        label_map = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise PipelineError(f"{path}: expected the label map JSON, found: {err}; re-run the extract stage") from None
    class_names(label_map)
    return label_map


def hf_features(names: list[str]) -> dict[str, Any]:
    """The `huggingface` metadata value, in the exact form `datasets` writes and reads back."""
    features: dict[str, Any] = {"image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"}}
    for name, dtype in FIELDS[2:]:
        features[name] = {"dtype": _VALUE_DTYPES[dtype], "_type": "Value"}
    return {"info": {"features": features}}


def shard_schema(label_map: dict[str, Any], params: dict[str, Any], split: str) -> pa.Schema:
    """The explicit schema of every shard of `split`, with deterministic metadata (no timestamps)."""
    own = {"label_map": label_map, "convert_params": params, "split": split, "hash_algorithm": HASH_ALGORITHM}
    metadata = {
        "huggingface": json.dumps(hf_features(class_names(label_map))),
        "imagenet_parquet": json.dumps(own, sort_keys=True),
    }
    return pa.schema([pa.field(name, dtype) for name, dtype in FIELDS], metadata=metadata)
