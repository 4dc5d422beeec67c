"""Tiny ILSVRC2012-shaped archives built by the extract tests (honest ones and a hostile zoo)."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import scipy.io

from tasks.extract import materialize as imagefolder, stage as extract
from tasks.common import ARCHIVES
from tasks.common.synsets import shipped_synsets

Member = tuple[str, bytes] | tarfile.TarInfo  # (name, data) or a ready TarInfo (links, devices, ...)


def image_bytes(seed: int) -> bytes:
    """Distinct fake image bytes (the extract stage never decodes them)."""
    return b"\xff\xd8\xff\xe0" + bytes([seed % 251]) * (700 + seed * 37 % 900) + seed.to_bytes(4, "big")


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


def special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


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
    import gzip

    gt = "".join(f"{i}\n" for i in ground_truth).encode()
    inner = tar_bytes([("ILSVRC2012_devkit_t12/data/meta.mat", meta_mat(ids, words)),
                       ("ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt", gt)])
    return gzip.compress(inner, mtime=0)


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
    outer = [(f"{w}.tar", tar_bytes([(n, image_bytes(next(seed))) for n in names] + list((inner_extra or {}).get(w, []))))
             for w, names in train.items()]
    (raw / ARCHIVES["train"]).write_bytes(tar_bytes(outer + list(extra_train)))
    (raw / ARCHIVES["val"]).write_bytes(tar_bytes([(n, image_bytes(next(seed))) for n in val] + list(extra_val)))
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
    return pq.read_table(out / "manifests" / f"{split}.parquet").to_pylist()
