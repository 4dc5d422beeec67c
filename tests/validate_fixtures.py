"""Purpose-built datasets for the validate stage: a small writer that follows docs/CONTRACTS.md exactly.

`make_dataset(root)` returns a valid `Dataset` (label map, manifests, Parquet shards, bad_images.jsonl) held as
plain Python rows; a test breaks it (a wrong label, foreign bytes, a missing class...) and calls `write()`."""
from __future__ import annotations

import hashlib
import io
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, UnidentifiedImageError

from tasks.common.layout import MANIFEST_SCHEMA
from imagenet_parquet.format import shard_schema
from params_helpers import section
from tasks.common.params import ValidateParams
from tasks.common.synsets import load_synsets

SOURCES = {"train": "data/raw/ILSVRC2012_img_train.tar", "val": "data/raw/ILSVRC2012_img_val.tar"}
PARAMS = {"train_count": [1, 1300], "val_count": [1, 50], "decode_sample": "all", "leakage_max_pairs": 0,
          "report_examples": 5, "contact_sheet_per_class": 2, "contact_sheet_classes": 20}


def validate_section(**overrides: Any) -> ValidateParams:
    """The typed `validate:` params for tests (a PipelineError naming the key when an override is invalid)."""
    return section("validate", **{**PARAMS, **overrides})


def jpeg(seed: int, size: tuple[int, int] = (24, 16)) -> bytes:
    """A small, unique, deterministic JPEG (noise over a colour that depends on the seed)."""
    rng = np.random.default_rng(seed)
    pixels = (rng.integers(0, 64, (size[1], size[0], 3)) + (seed * 37 % 192)).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def set_bytes(row: dict[str, Any], data: bytes, rehash: bool = True) -> None:
    """Replace a row's image bytes (and its sha256 unless `rehash` is False: a hash mismatch)."""
    row["image"] = {"bytes": data, "path": row["image"]["path"]}
    if rehash:
        row["sha256"] = hashlib.sha256(data).hexdigest()


def make_label_map(classes: int) -> dict[str, Any]:
    synsets = load_synsets()[:classes]
    return {"num_classes": classes, "label_source": "devkit", "classes": [
        {"label": i, "wnid": wnid, "name": words.split(",")[0].strip(), "words": words, "ilsvrc2012_id": i + 1}
        for i, (wnid, words) in enumerate(synsets)]}


@dataclass
class Dataset:
    root: Path
    label_map: dict[str, Any]
    rows: dict[str, list[dict[str, Any]]]  # Parquet rows per split (contract columns)
    manifests: dict[str, list[dict[str, Any]]]
    bad: list[dict[str, Any]] = field(default_factory=list)
    shards: dict[str, int] = field(default_factory=lambda: {"train": 2, "val": 1})
    row_group_rows: int = 4
    shard_label_maps: dict[str, dict[str, Any]] = field(default_factory=dict)  # per-split metadata override
    schema_overrides: dict[str, pa.Schema] = field(default_factory=dict)  # per split: a non-contract schema

    parquet_dir = property(lambda self: self.root / "parquet")
    manifests_dir = property(lambda self: self.root / "manifests")
    label_map_path = property(lambda self: self.root / "label_map.json")
    reports_dir = property(lambda self: self.root / "reports")
    metrics_path = property(lambda self: self.root / "metrics" / "validate.json")

    def row(self, split: str, name: str) -> dict[str, Any]:
        return next(r for r in self.rows[split] if r["image"]["path"] == name)

    def drop(self, split: str, label: int, manifest: bool = True) -> None:
        """Remove every image of `label` from a split (and from its manifest)."""
        self.rows[split] = [r for r in self.rows[split] if r["label"] != label]
        if manifest:
            self.manifests[split] = [m for m in self.manifests[split] if m["label"] != label]

    def write(self) -> Dataset:
        for sub in ("parquet", "manifests"):
            shutil.rmtree(self.root / sub, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.label_map_path.write_text(json.dumps(self.label_map, indent=2), encoding="utf-8")
        self.manifests_dir.mkdir()
        for split, rows in self.manifests.items():
            pq.write_table(pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA), self.manifests_dir / f"{split}.parquet")
        for split, rows in self.rows.items():
            self._write_split(split, rows)
        lines = "".join(json.dumps(b, sort_keys=True) + "\n" for b in self.bad)
        (self.parquet_dir / "bad_images.jsonl").write_text(lines, encoding="utf-8")
        return self

    def _write_split(self, split: str, rows: list[dict[str, Any]]) -> None:
        label_map = self.shard_label_maps.get(split, self.label_map)
        schema = self.schema_overrides.get(split) or shard_schema(label_map, {"policy": "passthrough"}, split)
        count = self.shards[split]
        (self.parquet_dir / split).mkdir(parents=True)
        for index, part in enumerate(np.array_split(np.arange(len(rows)), count)):
            table = pa.Table.from_pylist([rows[i] for i in part], schema=schema)
            pq.write_table(table, self.parquet_dir / split / f"{split}-{index:05d}-of-{count:05d}.parquet",
                           row_group_size=self.row_group_rows)


def _row(split: str, label: int, wnid: str, name: str, data: bytes, label_name: str) -> dict[str, Any]:
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except UnidentifiedImageError:  # not an image: the memory test's blobs
        width, height = 1, 1
    return {"image": {"bytes": data, "path": name}, "label": label, "wnid": wnid, "label_name": label_name,
            "width": width, "height": height, "source_format": "JPEG", "transform": "none",
            "exif_orientation": 1, "sha256": hashlib.sha256(data).hexdigest()}


def make_dataset(root: str | Path, classes: int = 3, train_per_class: int = 4, val_per_class: int = 2,
                 blob: Any = jpeg) -> Dataset:
    """A valid dataset: `classes` classes, sorted by (wnid, name) like the manifests. `blob(seed)` makes the
    bytes of each image (a JPEG by default)."""
    label_map = make_label_map(classes)
    rows: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    manifests: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    seed, val_number = 0, 0
    for cls in label_map["classes"]:
        for split, count in (("train", train_per_class), ("val", val_per_class)):
            for i in range(count):
                seed += 1
                if split == "train":
                    name, member = f"{cls['wnid']}_{i + 1}.JPEG", f"{cls['wnid']}.tar/{cls['wnid']}_{i + 1}.JPEG"
                else:
                    val_number += 1
                    name = member = f"ILSVRC2012_val_{val_number:08d}.JPEG"
                data = blob(seed)
                rows[split].append(_row(split, cls["label"], cls["wnid"], name, data, cls["name"]))
                manifests[split].append({"split": split, "label": cls["label"], "wnid": cls["wnid"], "name": name,
                                         "source": SOURCES[split], "member": member, "offset": 512 * seed,
                                         "size": len(data)})
    for split in rows:
        order = sorted(range(len(rows[split])), key=lambda i: (rows[split][i]["wnid"], rows[split][i]["image"]["path"]))
        rows[split] = [rows[split][i] for i in order]
        manifests[split] = sorted(manifests[split], key=lambda m: (m["wnid"], m["name"]))
    return Dataset(Path(root), label_map, rows, manifests)
