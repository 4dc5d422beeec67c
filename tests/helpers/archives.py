"""Tiny ILSVRC2012-shaped archives (honest ones and a hostile zoo), reading tars and devkits back, and the
extract stage run the way its flow runs it, without Prefect."""
from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import scipy.io

from tasks.common import ARCHIVES
from tasks.common.synsets import shipped_synsets
from tasks.extract import materialize as imagefolder
from tasks.extract import stage as extract
from tests.helpers.images import fake_jpeg

Member = tuple[str, bytes] | tarfile.TarInfo  # (name, data) or a ready TarInfo (links, devices, ...)
DEVKIT_META = "ILSVRC2012_devkit_t12/data/meta.mat"
DEVKIT_TRUTH = "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt"


def tar_bytes(members: list[Member], fmt: int = tarfile.GNU_FORMAT, encoding: str = "utf-8") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, encoding=encoding, errors="surrogateescape") as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size, info.mtime = len(member[1]), 1_335_000_000
                tar.addfile(info, io.BytesIO(member[1]))
    return buf.getvalue()


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A plain (ustar) tar of `members` at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(tar_bytes(members, fmt=tarfile.USTAR_FORMAT))
    return path


def special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def tar_entries(path: Path, prefix: str = "", base: int = 0, fileobj=None) -> list[tuple[str, int, int]]:
    """(member path, offset in the uncompressed file, size) of every image, descending into nested .tar members
    (offsets from tarfile's own `offset_data`, independent of the extract stage)."""
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


def meta_mat(ids: dict[str, int], words: dict[str, str] | None = None) -> bytes:
    """A meta.mat like the devkit's: the leaves plus one internal node (num_children > 0)."""
    fields = ["ILSVRC2012_ID", "WNID", "words", "num_children"]
    words = {**{w: s.words for w, s in shipped_synsets().items()}, **(words or {})}
    records = np.zeros((len(ids) + 1, 1), dtype=[(f, "O") for f in fields])
    for row, (wnid, ident) in enumerate([*ids.items(), ("n00001740", len(ids) + 1)]):
        children = len(ids) if wnid == "n00001740" else 0
        text = "entity" if children else words.get(wnid, f"thing {wnid}, other name")
        records[row, 0] = (np.array([[ident]]), np.array([wnid]), np.array([text]), np.array([[children]]))
    buf = io.BytesIO()
    scipy.io.savemat(buf, {"synsets": records})
    return buf.getvalue()


def devkit_bytes(ids: dict[str, int], ground_truth: list[int], words: dict[str, str] | None = None) -> bytes:
    gt = "".join(f"{i}\n" for i in ground_truth).encode()
    inner = tar_bytes([(DEVKIT_META, meta_mat(ids, words)), (DEVKIT_TRUTH, gt)])
    return gzip.compress(inner, mtime=0)


def read_devkit(devkit: Path) -> tuple[np.ndarray, list[int]]:
    """(the synsets records of meta.mat, squeezed; the val ground-truth ILSVRC2012_IDs) of a devkit archive."""
    with tarfile.open(devkit) as tar:
        meta = tar.extractfile(DEVKIT_META).read()
        truth = tar.extractfile(DEVKIT_TRUTH).read()
    synsets = scipy.io.loadmat(io.BytesIO(meta), squeeze_me=True)["synsets"]
    return synsets, [int(line) for line in truth.decode().split()]


def write_release(raw: Path, train: dict[str, list[str]], val: dict[str, str], ids: dict[str, int] | None = None,
                  extra_train: list[Member] = (), extra_val: list[Member] = (),
                  inner_extra: dict[str, list[Member]] | None = None) -> dict[str, str]:
    """Write the three archives into `raw`. `train` = wnid → image names; `val` = val name → wnid.

    `ids` = wnid → ILSVRC2012_ID (default: reverse sorted order, so ID order ≠ wnid order). Returns the truth
    (val name → wnid)."""
    raw.mkdir(parents=True, exist_ok=True)
    wnids = sorted(set(train) | set(val.values()))
    ids = ids or {w: len(wnids) - i for i, w in enumerate(wnids)}
    seed = iter(range(1, 1_000_000))
    outer = [(f"{w}.tar", tar_bytes([(n, fake_jpeg(next(seed))) for n in names] + list((inner_extra or {}).get(w, []))))
             for w, names in train.items()]
    (raw / ARCHIVES["train"]).write_bytes(tar_bytes(outer + list(extra_train)))
    (raw / ARCHIVES["val"]).write_bytes(tar_bytes([(n, fake_jpeg(next(seed))) for n in val] + list(extra_val)))
    truth = [ids[val[n]] for n in sorted(val)]
    (raw / ARCHIVES["devkit"]).write_bytes(devkit_bytes(ids, truth))
    return dict(val)


def small_release(raw: Path, classes: list[str] | None = None, per_class: int = 3, val_per_class: int = 2,
                  **kwargs) -> dict[str, str]:
    classes = classes or ["n01440764", "n01443537", "n02012849", "n03126707"]
    train = {w: [f"{w}_{k * 7 + 1}.JPEG" for k in range(per_class)] for w in classes}
    val = {f"ILSVRC2012_val_{i + 1:08d}.JPEG": classes[(len(classes) - 1 - i) % len(classes)]
           for i in range(len(classes) * val_per_class)}
    return write_release(raw, train, val, **kwargs)


def run_extract(raw: Path, out: Path, materialize: bool = False, **options) -> dict:
    """scan train + val, finalize (and materialize): what the flow does, without Prefect."""
    for split in extract.SPLITS:
        extract.scan_archive_split(split, raw / ARCHIVES[split], out / "staging", root=out)
    report = extract.finalize(out / "staging", out / "manifests", out / "label_map.json",
                              devkit_path=raw / ARCHIVES["devkit"], **options)
    if materialize:
        imagefolder.materialize(out / "manifests", out / "imagefolder", root=out)
    return report


def manifest(out: Path, split: str) -> list[dict]:
    """The rows of the manifest run_extract wrote under `out`."""
    return pq.read_table(out / "manifests" / f"{split}.parquet").to_pylist()
