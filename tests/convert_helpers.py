"""Inputs for convert tests: tars of images + manifests (offsets from tarfile's offset_data) + a label map.

Built here directly (docs/CONTRACTS.md formats) so the convert tests do not depend on the extract stage."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.io
from PIL import Image

from tasks.common import ARCHIVES
from params_helpers import section
from tasks.convert.job import Job, job_from_params

MANIFEST_SCHEMA = pa.schema([("split", pa.string()), ("label", pa.int64()), ("wnid", pa.string()),
                             ("name", pa.string()), ("source", pa.string()), ("member", pa.string()),
                             ("offset", pa.int64()), ("size", pa.int64())])
REPO = Path(__file__).resolve().parents[1]
BASE_PARAMS = {"max_bad_fraction": 0.5}  # over the repository's params.yaml: tests plant bad images


def jpeg(color=(200, 30, 40), size=(64, 48), mode="RGB", fmt="JPEG", **save) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).convert(mode).save(buf, fmt, **save)
    return buf.getvalue()


def noisy_jpeg(seed: int, size=(96, 72)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=80)
    return buf.getvalue()


def tar_entries(path: Path, prefix: str = "", base: int = 0, fileobj=None) -> list[tuple[str, int, int]]:
    """(member path, offset in the uncompressed file, size) of every image, descending into nested .tar members."""
    out = []
    with tarfile.open(path, mode="r:", fileobj=fileobj) as tar:
        for info in tar.getmembers():
            if not info.isfile():
                continue
            if info.name.endswith(".tar"):
                inner = io.BytesIO(tar.extractfile(info).read())
                out += tar_entries(path, f"{prefix}{info.name}/", base + info.offset_data, inner)
            else:
                out.append((f"{prefix}{info.name}", base + info.offset_data, info.size))
    return out


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return path


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
    with tarfile.open(devkit) as tar:
        names = tar.getnames()
        meta = scipy.io.loadmat(io.BytesIO(tar.extractfile(next(n for n in names if n.endswith("meta.mat"))).read()))
        truth = tar.extractfile(next(n for n in names if n.endswith("ground_truth.txt"))).read().split()
    id_wnid = {int(s["ILSVRC2012_ID"].squeeze()): str(s["WNID"].squeeze()) for s in meta["synsets"].ravel()}
    rows["val"] = [(id_wnid[int(truth[i])], str(val), m, o, n) for i, (m, o, n) in enumerate(tar_entries(val))]
    write_inputs(root, rows, sorted({r[0] for r in rows["train"]}))


def make_job(root: Path, **params) -> Job:
    repo_paths = {key: Path(value) for key, value in section("paths").model_dump().items()}
    return job_from_params(section("convert", **{**BASE_PARAMS, **params}), repo_paths, root=root)


def read_rows(job: Job, split: str = "train") -> list[dict]:
    files = sorted((job.parquet / split).glob("*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def shard_bytes(job: Job) -> dict[str, bytes]:
    return {str(f.relative_to(job.parquet)): f.read_bytes() for f in sorted(job.parquet.rglob("*")) if f.is_file()}
