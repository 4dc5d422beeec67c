"""Val labels: the devkit (meta.mat + validation ground truth) or a `filename,wnid` CSV.

meta.mat lists 1860 synsets; the 1000 classes are the leaves (`num_children == 0`), each with an
ILSVRC2012_ID. The ground-truth file holds one ID per val image, in ascending file-name order. ID order is
not sorted-wnid order, so labels always go through ID → WNID, never through an ID used as a label index."""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa
import scipy.io

from tasks.common import PipelineError
from tasks.common.params import resolve_path
from tasks.common.synsets import WNID, Catalog, Synset, shipped_catalog
from tasks.common.tarindex import open_tar, safe_members
from tasks.extract.folder_scan import source_path

META = "meta.mat"
GROUND_TRUTH = "ILSVRC2012_validation_ground_truth.txt"
MAX_MEMBER_BYTES = 64 << 20  # meta.mat is ~2.5 MB, the ground truth ~0.2 MB: more is not a devkit file


@dataclass(frozen=True)
class Devkit:
    leaves: dict[str, Synset]  # wnid → Synset (with its ILSVRC2012_ID)
    ground_truth: list[int]  # one ILSVRC2012_ID per val image, ascending file-name order

    @property
    def wnid_by_id(self) -> dict[int, str]:
        return {s.ilsvrc2012_id: wnid for wnid, s in self.leaves.items() if s.ilsvrc2012_id is not None}


def _devkit_files(path: Path) -> dict[str, bytes]:
    """The bytes of meta.mat and the ground truth, found by file name anywhere in the devkit tar.gz."""
    found: dict[str, bytes] = {}
    with open_tar(path, "r:gz") as tar:
        for info in safe_members(tar, str(path), None):
            base = PurePosixPath(info.name).name
            if not info.isreg() or base not in (META, GROUND_TRUTH):
                continue
            if base in found:
                raise PipelineError(
                    f"{path}: expected one {base}, found another at {info.name!r}; "
                    "use the official ILSVRC2012_devkit_t12.tar.gz"
                )
            if info.size > MAX_MEMBER_BYTES:
                raise PipelineError(
                    f"{path}: refused member {info.name!r}: it declares {info.size} bytes, "
                    f"more than a devkit file can hold ({MAX_MEMBER_BYTES}); use the official devkit"
                )
            member = tar.extractfile(info)
            assert member is not None  # a regular file (isreg above) always has one
            found[base] = member.read()
    missing = sorted({META, GROUND_TRUTH} - set(found))
    if missing:
        raise PipelineError(
            f"{path}: expected data/{META} and data/{GROUND_TRUTH}, missing {missing}; "
            "use the official devkit or set extract.val_labels to a filename,wnid CSV"
        )
    return found


def read_devkit(path: str | os.PathLike[str]) -> Devkit:
    path = Path(path)
    files = _devkit_files(path)
    return Devkit(
        parse_meta(files[META], f"{path}:{META}"),
        parse_ground_truth(files[GROUND_TRUTH].decode("ascii", "replace"), f"{path}:{GROUND_TRUTH}"),
    )


def _scalar(value: Any) -> Any:
    array = np.asarray(value).squeeze()
    return array.item() if array.ndim == 0 else array


def parse_meta(data: bytes, where: str) -> dict[str, Synset]:
    """Leaf synsets of meta.mat (num_children == 0), by wnid, each with its ILSVRC2012_ID and words."""
    try:
        records = np.atleast_1d(scipy.io.loadmat(io.BytesIO(data), squeeze_me=True)["synsets"])
    except Exception as err:  # scipy raises many types for a damaged file
        raise PipelineError(
            f"{where}: expected a MATLAB file with a 'synsets' struct array, found {err!r}; use the official devkit"
        ) from None
    needed = ("ILSVRC2012_ID", "WNID", "words", "num_children")
    missing = [f for f in needed if f not in (records.dtype.names or ())]
    if missing:
        raise PipelineError(
            f"{where}: expected synsets fields {list(needed)}, missing {missing}; use the official devkit"
        )
    leaves: dict[str, Synset] = {}
    ids: set[int] = set()
    for record in records:
        if int(_scalar(record["num_children"])) != 0:
            continue
        wnid, ident = str(_scalar(record["WNID"])), int(_scalar(record["ILSVRC2012_ID"]))
        if not WNID.match(wnid) or wnid in leaves or ident in ids:
            raise PipelineError(
                f"{where}: expected unique leaf wnids and IDs, found wnid {wnid!r} with ID {ident} "
                "twice or malformed; use the official devkit"
            )
        leaves[wnid] = Synset(wnid, str(_scalar(record["words"])), ident)
        ids.add(ident)
    if not leaves:
        raise PipelineError(f"{where}: expected leaf synsets (num_children == 0), found none; use the official devkit")
    return leaves


def parse_ground_truth(text: str, where: str) -> list[int]:
    ids = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            if not line.strip().isdigit():
                raise PipelineError(
                    f"{where}:{number}: expected one integer ILSVRC2012_ID per line, found "
                    f"{line.strip()[:40]!r}; use the official devkit"
                )
            ids.append(int(line))
    return ids


def labels_from_devkit(devkit: Devkit, names: list[str], where: str) -> dict[str, str]:
    """val file name → wnid: the i-th ID of the ground truth labels the i-th val file in name order."""
    ordered = sorted(names)
    if len(devkit.ground_truth) != len(ordered):
        raise PipelineError(
            f"{where}: expected one ground-truth ID per val image ({len(ordered)} images), found "
            f"{len(devkit.ground_truth)} IDs; the devkit and the val archive do not belong together"
        )
    by_id = devkit.wnid_by_id
    unknown = sorted(set(devkit.ground_truth) - set(by_id))
    if unknown:
        raise PipelineError(
            f"{where}: expected ground-truth IDs of leaf synsets, found {len(unknown)} unknown "
            f"ID(s): {unknown[:20]}; use the official devkit"
        )
    return {name: by_id[ident] for name, ident in zip(ordered, devkit.ground_truth, strict=True)}


def read_label_csv(path: str | os.PathLike[str]) -> dict[str, str]:
    """A `filename,wnid` CSV (header required) → {file name: wnid}."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(
            f"params.yaml extract.val_labels: expected devkit or a filename,wnid CSV, found "
            f"{str(path)!r} (no such file); fix the parameter"
        )
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    if not rows or [c.strip() for c in rows[0]] != ["filename", "wnid"]:
        raise PipelineError(f"{path}: expected the header 'filename,wnid', found {rows[:1]}; fix the CSV")
    mapping: dict[str, str] = {}
    for number, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != 2 or not WNID.match(row[1].strip()) or row[0].strip() in mapping:
            raise PipelineError(
                f"{path}:{number}: expected a unique file name and a wnid like n01440764, found {row}; fix the CSV"
            )
        mapping[row[0].strip()] = row[1].strip()
    return mapping


def check_label_coverage(mapping: dict[str, str], names: list[str], where: str, archive: str) -> None:
    """The label source must label exactly the val images: no image without a label, no label without an image."""
    unlabelled = sorted(set(names) - set(mapping))
    orphans = sorted(set(mapping) - set(names))
    if unlabelled or orphans:
        raise PipelineError(
            f"{where}: expected one label per image of {archive} ({len(set(names))} images), found "
            f"{len(unlabelled)} image(s) without a label (e.g. {unlabelled[:5]}) and {len(orphans)} "
            f"label(s) for missing images (e.g. {orphans[:5]}); use the label file of this archive"
        )


def label_val(
    val: pa.Table, val_where: str, val_labels: str, devkit_path: Path | None, root: Path
) -> tuple[pa.Table, Catalog, str]:
    """Archives mode: give every val row its wnid; return (val, the catalog, the label source)."""
    names = val.column("name").to_pylist()
    devkit = read_devkit(devkit_path) if devkit_path and (val_labels == "devkit" or devkit_path.exists()) else None
    catalog = shipped_catalog()
    if devkit and devkit_path:
        shown = f"{source_path(devkit_path, root)}:{META}"  # repo-relative: extract_report.json is the same anywhere
        described = f"the {len(devkit.leaves)} classes of {shown}"
        catalog = Catalog(devkit.leaves, shown, described, f"a class listed in {shown}")
    if val_labels == "devkit":
        if devkit is None:  # finalize_job always passes it; a library caller may not
            raise PipelineError(
                "extract.val_labels is devkit: expected devkit_path (ILSVRC2012_devkit_t12.tar.gz), "
                "found none; pass it, or a filename,wnid CSV as val_labels"
            )
        mapping = labels_from_devkit(devkit, names, f"{devkit_path}:{GROUND_TRUTH}")
    else:
        mapping = read_label_csv(resolve_path(root, val_labels))
        check_label_coverage(mapping, names, val_labels, val_where)
    wnids = pa.array([mapping[name] for name in names], pa.string())
    return (
        val.set_column(val.schema.get_field_index("wnid"), "wnid", wnids),
        catalog,
        "devkit" if val_labels == "devkit" else "csv",
    )
