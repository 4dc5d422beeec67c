"""The merged view validate checks: the shards as converted plus the curate stage's overlay (merge-on-read).

`apply_overlays` loads each split's overlay (`<paths.overlay>/<split>.parquet`, imagenet_parquet/overlay.py)
against the shards found — their names, row counts and footer SHA-256s — and gives the label now and the keep
flag of every row of the metadata frame. An overlay that does not belong to these shards (made for another
version, altered, damaged) fails the `overlay_matches_shards` check, naming the overlay: the shard checks still
run, and that split's class, leakage and near-duplicate checks run on the shards as converted. No overlay file at
all ends the stage (PipelineError): nothing says which labels the dataset has. `merged_frame` is the metadata of
the rows kept, with their current label, class id and name."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from imagenet_parquet.format import FormatError, class_ids
from imagenet_parquet.overlay import OVERLAY_KEY, Overlay, footer_digest, footer_tail, load_overlay
from tasks.common import SPLITS, PipelineError
from tasks.common.layout import CURATION_REPORT
from tasks.validate.checks import CheckResult, passed
from tasks.validate.scan import Shard

CHECK = "overlay_matches_shards"
# what the merged view's checks read: class counts, leakage, decode sample, version index, example rows
MERGED_COLUMNS = ["split", "shard", "row", "image_path", "label", "wnid", "label_name", "sha256"]
TODO = "run `dvc repro curate`"


@dataclass
class View:
    """Per row of the metadata frame (split → shard → row): the label now and whether the row is kept."""

    labels: np.ndarray
    keep: np.ndarray
    result: CheckResult
    edits: dict[str, dict[str, int]]  # split -> relabelled / excluded rows

    def split(self, meta: pd.DataFrame, split: str) -> tuple[np.ndarray, np.ndarray]:
        """(labels, keep) of `split`'s rows, in shard order (the order the shards are listed in)."""
        rows = (meta["split"] == split).to_numpy()
        return self.labels[rows], self.keep[rows]


def overlay_file(overlay_dir: Path, split: str) -> Path:
    return overlay_dir / f"{split}.parquet"


def require_overlays(overlay_dir: Path) -> dict[str, Any]:
    """Every split's overlay is there (else a PipelineError: nothing says which labels the dataset has); returns
    curation.json (`load_curation`)."""
    for split in SPLITS:
        path = overlay_file(overlay_dir, split)
        if not path.is_file():
            raise PipelineError(
                f"{path}: expected the {split} curation overlay written by the curate stage (the labels and "
                f"exclusions every reader applies to the shards), found no file; {TODO}"
            )
    return load_curation(overlay_dir)


def load_curation(overlay_dir: Path) -> dict[str, Any]:
    """curation.json: the curation lines the curate stage applied (files, counts, `applied`, `not_in_shards`)."""
    path = overlay_dir / CURATION_REPORT
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PipelineError(
            f"{path}: expected the curate stage's report of the curation lines applied, found no file; {TODO}"
        ) from None
    except (OSError, ValueError) as err:
        raise PipelineError(f"{path}: expected the curate stage's JSON report, found {err}; {TODO}") from None
    if not isinstance(found, dict) or not isinstance(found.get("applied", []), list):
        raise PipelineError(f"{path}: expected a JSON object with an `applied` list, found another form; {TODO}")
    return found


def apply_overlays(
    meta: pd.DataFrame,
    plan: list[Shard],
    overlay_dir: Path,
    label_map: dict[str, Any],
    limit: int,
    live: np.ndarray | None = None,
    appended: set[str] | frozenset[str] = frozenset(),
) -> View:
    """Every split's overlay checked against its shards and applied (see the module docstring). `live` (appended
    shards, issue 33: tasks/validate/sources.py): the rows the source holds now — the overlay must exclude every
    other row (removed from the source, or replaced) and, in the splits `appended` (appended shards, other label
    maps) or where it excludes such rows, be format 2 with label_map.json's label map."""
    labels = meta["label"].to_numpy(dtype=np.int64, na_value=-1).copy()
    keep = np.ones(len(meta), dtype=bool)
    problems, edits = [], {}
    for split in SPLITS:
        shards = [s for s in plan if s.split == split]
        path = overlay_file(overlay_dir, split)
        first, rows = (shards[0].first, sum(s.rows for s in shards)) if shards else (0, 0)
        try:
            part = None if live is None else live[first : first + rows]
            overlay = _load(path, split, shards, label_map, part, split in appended)
        except FormatError as err:  # OverlayError, or a shard whose footer cannot be read
            problems.append({"split": split, "overlay": str(path), "found": str(err)})
            continue
        converted = labels[first : first + rows].copy()
        labels[first : first + rows], keep[first : first + rows] = overlay.labels, overlay.keep
        edits[split] = {
            "relabelled": int((overlay.labels != converted)[overlay.keep].sum()),
            "excluded": int((~overlay.keep).sum()),
        }
    return View(labels, keep, _result(problems, edits, limit), edits)


def _load(
    path: Path, split: str, shards: list[Shard], label_map: dict[str, Any], live: np.ndarray | None, appended: bool
) -> Overlay:
    """The overlay of `split` for exactly these shards (none missing, none extra), or a FormatError."""
    names = [s.path.name for s in shards]
    listed = _listed(path)
    extra = sorted(set(listed) - set(names))
    if extra:
        raise FormatError(
            f"{path}: expected an overlay for the {len(names)} {split} shards found, found one listing shards "
            f"that are not there: {extra[:3]} (made for another version); {TODO}"
        )
    footers = [footer_digest(footer_tail(s.path)) for s in shards]
    overlay = load_overlay(path, names, [s.rows for s in shards], footers, label_map["num_classes"])
    if overlay.split != split:
        raise FormatError(f"{path}: expected the {split} overlay, found the {overlay.split!r} one; {TODO}")
    if live is not None:
        _check_sources(path, split, overlay, label_map, live, appended or not live.all())
    return overlay


def _check_sources(
    path: Path, split: str, overlay: Overlay, label_map: dict[str, Any], live: np.ndarray, format_2: bool
) -> None:
    """Over appended shards: the overlay keeps no row the source no longer holds (removed from it, or replaced by
    a newer version of the image), and gives label_map.json's labels — format 2 with that map where `format_2`
    (else format 1: the shards' own, then label_map.json's too)."""
    if overlay.label_map != label_map and (format_2 or overlay.label_map is not None):
        found = "overlay format 1" if overlay.label_map is None else "another label map"
        raise FormatError(
            f"{path}: expected a format-2 overlay with label_map.json's label map (the {split} shards were written "
            f"with several label maps, or appended), found {found}; {TODO}"
        )
    stale = np.flatnonzero(overlay.keep & ~live)
    if len(stale):
        raise FormatError(
            f"{path}: expected the rows removed from the source or replaced by a newer version excluded, found "
            f"{len(stale)} kept (row {int(stale[0])} of the {split} shards first); {TODO}"
        )


def overlay_formats(overlay_dir: Path) -> dict[str, Any]:
    """Each split's overlay format (its footer only; None when unreadable: load_overlay then names the problem)."""
    found = {}
    for split in SPLITS:
        try:
            meta = json.loads((pq.read_metadata(overlay_file(overlay_dir, split)).metadata or {})[OVERLAY_KEY])
            found[split] = meta.get("format") if isinstance(meta, dict) else None
        except (OSError, KeyError, ValueError, TypeError):
            found[split] = None
    return found


def _listed(path: Path) -> list[str]:
    """The shard names the overlay's footer lists (read_overlay checks the rest); [] when unreadable."""
    try:
        meta = json.loads((pq.read_metadata(path).metadata or {})[OVERLAY_KEY])
        return [str(s[0]) for s in meta["shards"]]
    except (OSError, KeyError, ValueError, TypeError, IndexError):
        return []  # load_overlay then names what is wrong


def _result(problems: list[dict[str, Any]], edits: dict[str, dict[str, int]], limit: int) -> CheckResult:
    if not problems:
        done = "; ".join(f"{s}: {e['relabelled']} relabelled, {e['excluded']} excluded" for s, e in edits.items())
        return passed(CHECK, f"every overlay belongs to its shards ({done})")
    first = problems[0]
    message = (
        f"{len(problems)} split(s) whose overlay does not belong to the shards — {first['split']}: {first['found']} "
        f"(the class, leakage and near-duplicate checks of {', '.join(p['split'] for p in problems)} ran on the "
        "shards as converted, without curation)"
    )
    return CheckResult(CHECK, "fail", message, len(problems), problems[:limit])


def merged_frame(meta: pd.DataFrame, view: View, label_map: dict[str, Any]) -> pd.DataFrame:
    """The kept rows (index: their row in `meta`) with the current label, its class id (`wnid`) and name: `meta`
    itself when the overlay changes nothing, else a copy of the MERGED_COLUMNS only (pointers to the same
    strings: ~64 B a row)."""
    changed = view.labels != meta["label"].to_numpy(dtype=np.int64, na_value=-1)
    if view.keep.all() and not changed.any():
        return meta
    frame = meta.loc[view.keep, [c for c in MERGED_COLUMNS if c in meta]]
    changed = changed[view.keep]
    if changed.any():
        ids, names = class_ids(label_map), [c["name"] for c in label_map["classes"]]
        new = view.labels[view.keep][changed]
        frame.loc[changed, "label"] = new
        frame.loc[changed, "wnid"] = np.asarray(ids, dtype=object)[new]
        frame.loc[changed, "label_name"] = np.asarray(names, dtype=object)[new]
    return frame
