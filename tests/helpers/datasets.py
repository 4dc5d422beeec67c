"""Stage inputs and outputs written directly in the docs/CONTRACTS.md formats, so that each stage's tests depend on
no other stage: manifests + label map + tars for convert (and convert jobs), a complete convert output for validate
(`Dataset`, rows held as plain Python, broken by a test then written), and self-identifying reader shards."""
from __future__ import annotations

import hashlib
import io
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, UnidentifiedImageError

from imagenet_parquet.format import UNCOMPRESSED_COLUMNS, shard_schema
from tasks.common import ARCHIVES
from tasks.common.synsets import load_synsets
from tasks.convert.fingerprint import fingerprint
from tasks.convert.job import Job, job_from_params
from tests.helpers.archives import read_devkit, tar_entries, write_tar
from tests.helpers.images import indexed_jpeg, noisy_jpeg
from tests.helpers.params import section

MANIFEST_SCHEMA = pa.schema([("split", pa.string()), ("label", pa.int64()), ("wnid", pa.string()),
                             ("name", pa.string()), ("source", pa.string()), ("member", pa.string()),
                             ("offset", pa.int64()), ("size", pa.int64())])


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.parquet"


def contract_row(data: bytes, path: str, label: int, wnid: str, label_name: str) -> dict[str, Any]:
    """One Parquet row of the shard schema for image bytes `data` (width/height read from them; 1x1 when they are
    no image, like the memory test's blobs)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except UnidentifiedImageError:
        width, height = 1, 1
    return {"image": {"bytes": data, "path": path}, "label": label, "wnid": wnid, "label_name": label_name,
            "width": width, "height": height, "source_format": "JPEG", "transform": "none",
            "exif_orientation": 1, "sha256": hashlib.sha256(data).hexdigest(), "phash": _phash(data)}


def _phash(data: bytes) -> int | None:
    """The convert stage's fingerprint of `data`; None (a null) for blobs that are no image."""
    try:
        return fingerprint(data)
    except Exception:
        return None


# ---------------------------------------------------------------- convert: inputs and jobs
CONVERT_DEFAULTS = {"max_bad_fraction": 0.5}  # over the repository's params.yaml: tests plant bad images


def write_inputs(root: Path, rows: dict[str, list[tuple[str, str, str, int, int]]], wnids: list[str]) -> None:
    """Manifests from rows {split: [(wnid, source, member, offset, size)]} + a label map over `wnids`."""
    label = {w: i for i, w in enumerate(sorted(wnids))}
    (root / "data" / "manifests").mkdir(parents=True, exist_ok=True)
    for split, entries in rows.items():
        records = sorted(({"split": split, "label": label[w], "wnid": w, "name": m.rsplit("/", 1)[-1], "source": s,
                           "member": m, "offset": o, "size": n} for w, s, m, o, n in entries),
                         key=lambda r: (r["wnid"], r["name"]))
        pq.write_table(pa.Table.from_pylist(records, schema=MANIFEST_SCHEMA),
                       root / "data" / "manifests" / f"{split}.parquet")
    classes = [{"label": i, "wnid": w, "name": f"class {w}", "words": f"class {w}", "ilsvrc2012_id": None}
               for i, w in enumerate(sorted(wnids))]
    (root / "data" / "label_map.json").write_text(json.dumps(
        {"num_classes": len(classes), "label_source": "devkit", "classes": classes}), encoding="utf-8")


def flat_dataset(root: Path, images: list[tuple[str, str, bytes]], split: str = "train") -> Path:
    """One tar `data/raw/<split>.tar` of `images` [(wnid, name, bytes)]; manifests + label map; returns the tar."""
    tar = write_tar(root / "data" / "raw" / f"{split}.tar", [(name, data) for _, name, data in images])
    wnid_of = {name: wnid for wnid, name, _ in images}
    entries = [(wnid_of[m], "data/raw/" + tar.name, m, o, n) for m, o, n in tar_entries(tar)]
    write_inputs(root, {split: entries}, sorted(set(wnid_of.values())))
    return tar


def sample_dataset(root: Path, release: Path) -> None:
    """Manifests + label map for the built-in sample archives (val labels from the devkit's ground truth)."""
    train, val, devkit = (release / ARCHIVES[k] for k in ("train", "val", "devkit"))
    rows = {"train": [(m.split("/")[0][:-4], str(train), m, o, n) for m, o, n in tar_entries(train)]}
    synsets, truth = read_devkit(devkit)
    id_wnid = {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets}
    rows["val"] = [(id_wnid[truth[i]], str(val), m, o, n) for i, (m, o, n) in enumerate(tar_entries(val))]
    write_inputs(root, rows, sorted({r[0] for r in rows["train"]}))


def make_job(root: Path, **params) -> Job:
    """The convert job of the repository's params (CONVERT_DEFAULTS, then `params`) for a project at `root`."""
    repo_paths = {key: Path(value) for key, value in section("paths").model_dump().items()}
    return job_from_params(section("convert", **{**CONVERT_DEFAULTS, **params}), repo_paths, root=root)


def read_rows(job: Job, split: str = "train") -> list[dict]:
    files = sorted((job.parquet / split).glob("*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def shard_bytes(job: Job) -> dict[str, bytes]:
    return {str(f.relative_to(job.parquet)): f.read_bytes() for f in sorted(job.parquet.rglob("*")) if f.is_file()}


# ---------------------------------------------------------------- validate: a complete convert output
SOURCES = {"train": "data/raw/ILSVRC2012_img_train.tar", "val": "data/raw/ILSVRC2012_img_val.tar"}


def small_jpeg(seed: int) -> bytes:
    """The default image of a validate dataset: small, unique per seed."""
    return noisy_jpeg(seed, size=(24, 16), quality=90)


def set_bytes(row: dict[str, Any], data: bytes, rehash: bool = True) -> None:
    """Replace a row's image bytes (and its sha256 unless `rehash` is False: a hash mismatch)."""
    row["image"] = {"bytes": data, "path": row["image"]["path"]}
    if rehash:
        row["sha256"] = hashlib.sha256(data).hexdigest()


def synset_label_map(classes: int) -> dict[str, Any]:
    """A devkit-style label map over the first `classes` real synsets."""
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
    overlay: bool = True  # write an overlay that changes nothing (as the curate stage does without curation lines)

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
        if self.overlay:
            from tests.helpers.overlays import write_test_overlay

            write_test_overlay(self.parquet_dir)
        return self

    def _write_split(self, split: str, rows: list[dict[str, Any]]) -> None:
        label_map = self.shard_label_maps.get(split, self.label_map)
        schema = self.schema_overrides.get(split) or shard_schema(label_map, {"policy": "passthrough"}, split)
        count = self.shards[split]
        (self.parquet_dir / split).mkdir(parents=True)
        for index, part in enumerate(np.array_split(np.arange(len(rows)), count)):
            table = pa.Table.from_pylist([rows[i] for i in part], schema=schema)
            pq.write_table(table, self.parquet_dir / split / shard_name(split, index, count),
                           row_group_size=self.row_group_rows)


def make_dataset(root: str | Path, classes: int = 3, train_per_class: int = 4, val_per_class: int = 2,
                 blob: Callable[[int], bytes] = small_jpeg) -> Dataset:
    """A valid dataset: `classes` classes, sorted by (wnid, name) like the manifests. `blob(seed)` makes the
    bytes of each image (a JPEG by default)."""
    label_map = synset_label_map(classes)
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
                rows[split].append(contract_row(data, name, cls["label"], cls["wnid"], cls["name"]))
                manifests[split].append({"split": split, "label": cls["label"], "wnid": cls["wnid"], "name": name,
                                         "source": SOURCES[split], "member": member, "offset": 512 * seed,
                                         "size": len(data)})
    for split in rows:
        order = sorted(range(len(rows[split])), key=lambda i: (rows[split][i]["wnid"], rows[split][i]["image"]["path"]))
        rows[split] = [rows[split][i] for i in order]
        manifests[split] = sorted(manifests[split], key=lambda m: (m["wnid"], m["name"]))
    return Dataset(Path(root), label_map, rows, manifests)


# ---------------------------------------------------------------- reader: self-identifying shards
def numbered_label_map(classes: int) -> dict[str, Any]:
    """A label map of made-up classes n10000000, n10000001, ... named "class 0", "class 1", ..."""
    return {"num_classes": classes, "label_source": "devkit",
            "classes": [{"label": k, "wnid": f"n{10000000 + k:08d}", "name": f"class {k}",
                         "words": f"class {k}, thing {k}", "ilsvrc2012_id": k + 1} for k in range(classes)]}


def write_shards(out_dir: Path, split: str = "train", classes: int = 3, total: int = 47, shards: int = 3,
                 row_group_rows: int = 4, noise_px: int = 0) -> list[Path]:
    """`total` rows sorted by label over `shards` files of `row_group_rows`-row groups, compressed as convert
    compresses; image i (global row index in shard order) is `indexed_jpeg(i)`, so a decoded sample says which
    row it came from (`tests.helpers.images.identify`). Returns the files."""
    lmap = numbered_label_map(classes)
    labels = [i * classes // total for i in range(total)]
    schema = shard_schema(lmap, {"policy": "passthrough", "row_group_rows": row_group_rows}, split)
    compression = {c: "NONE" if c in UNCOMPRESSED_COLUMNS else "ZSTD"
                   for c in ["image.bytes", "image.path", *schema.names[1:]]}

    def row(i: int) -> dict[str, Any]:
        cls = lmap["classes"][labels[i]]
        return contract_row(indexed_jpeg(i, noise_px), f"{cls['wnid']}_{i:05d}.JPEG", cls["label"], cls["wnid"],
                            cls["name"])

    out = Path(out_dir) / split
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for s in range(shards):
        rows = [row(i) for i in range(s * total // shards, (s + 1) * total // shards)]
        path = out / shard_name(split, s, shards)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=row_group_rows,
                       compression=compression)
        files.append(path)
    (Path(out_dir) / "label_map.json").write_text(json.dumps(lmap, sort_keys=True), encoding="utf-8")
    return files
