"""The contact sheet: a few thumbnails per class, train next to val, captioned with label index, wnid and name.

"Look at a batch before training": a val set whose labels are shifted shows as rows whose val pictures do not
match their train pictures. Each picked image is one pread through the shard's byte index (the row groups that
hold them only for a shard without one: reading a 100-row group per thumbnail read ~20 % of the dataset again at
40,000 images), and the PNG bytes are deterministic (fixed layout, Pillow's built-in font, no metadata)."""

from __future__ import annotations

import io
import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from PIL import Image, ImageDraw, ImageFont, ImageOps

from imagenet_parquet.format import FormatError, class_ids, decode_image_index, read_indexed, read_label_map
from imagenet_parquet.markers import draft
from imagenet_parquet.overlay import OVERLAY_DIR, read_overlay
from tasks.common import SPLITS, atomic_path
from tasks.common.params import path_key
from tasks.validate.scan import iter_row_groups, list_shards

THUMB = 72  # thumbnail box, px
CELL = THUMB + 4
CAPTION_WIDTH = 260
MARGIN, GAP, HEADER = 8, 16, 24
Picks = dict[tuple[str, int], list[tuple[Path, int]]]
Overlaid = dict[str, tuple[np.ndarray, np.ndarray]]  # shard name -> (labels now, keep) of its rows


def shown_labels(num_classes: int, max_classes: int) -> list[int]:
    """All labels, or `max_classes` of them evenly spaced from first to last."""
    if num_classes <= max_classes:
        return list(range(num_classes))
    if max_classes <= 1:
        return [0][:max_classes]
    return sorted({round(i * (num_classes - 1) / (max_classes - 1)) for i in range(max_classes)})


def select_rows(
    shards: dict[str, list[Path]], labels: list[int], per_class: int, overlays: dict[str, Overlaid] | None = None
) -> Picks:
    """The first `per_class` rows of each shown label per split, in shard order (reads the label column only,
    of the shards up to the one that fills the last pick: in hashed order a few of ImageNet-21k's ~5,000).
    `overlays`: per split the curation overlay's labels and keep flags by shard (`overlaid`): rows by their label
    now, excluded rows never shown."""
    picks: defaultdict[tuple[str, int], list[tuple[Path, int]]] = defaultdict(list)
    for split in SPLITS:
        for path in shards[split]:
            if all(len(picks[split, label]) >= per_class for label in labels):
                break
            column = pq.read_table(path, columns=["label"]).column("label").to_numpy(zero_copy_only=False)
            now, keep = (overlays or {}).get(split, {}).get(path.name, (column, None))
            if keep is not None and len(keep) == len(column):  # else another shard: validate's overlay check fails
                column = np.where(keep, now, -1)
            for row in np.flatnonzero(np.isin(column, labels)):
                label = int(column[row])
                if len(picks[split, label]) < per_class:
                    picks[split, label].append((path, int(row)))
    return {key: rows for key, rows in picks.items() if rows}


def overlaid(overlay_dir: Path, split: str) -> Overlaid:
    """shard name -> (labels now, keep) from the split's curation overlay; {} when there is none or it cannot be
    read (the sheet then shows the shards as converted; validate's overlay check names the problem)."""
    try:
        meta, table = read_overlay(overlay_dir / f"{split}.parquet")
    except FormatError:
        return {}
    labels = table.column("label").to_numpy()
    keep = table.column("keep").to_numpy(zero_copy_only=False)
    ends = np.cumsum([int(s[1]) for s in meta["shards"]])
    return {
        str(s[0]): (labels[end - int(s[1]) : end], keep[end - int(s[1]) : end])
        for s, end in zip(meta["shards"], ends, strict=True)
    }


def thumbnail(data: bytes | memoryview) -> Image.Image | None:
    """An RGB thumbnail within THUMB x THUMB (as a PIL loader sees the pixels), None when undecodable."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            draft(image, data, "RGB", (THUMB, THUMB))  # JPEGs the reader's decoder gate passes, only
            rgb = image.convert("RGB")
    except Exception:  # the decode check reports it; the sheet shows an empty cell
        return None
    return ImageOps.contain(rgb, (THUMB, THUMB), Image.Resampling.BILINEAR)


def read_thumbnails(picks: Picks) -> dict[tuple[Path, int], Image.Image | None]:
    """Thumbnails of the picked rows, reading only their bytes."""
    rows_by_file: dict[Path, set[int]] = defaultdict(set)
    for rows in picks.values():
        for path, row in rows:
            rows_by_file[path].add(row)
    thumbs = {}
    for path in sorted(rows_by_file):
        for row, data in picked_bytes(path, rows_by_file[path]):
            thumbs[path, row] = thumbnail(data) if data is not None else None
    return thumbs


def picked_bytes(path: Path, wanted: set[int]) -> Iterator[tuple[int, bytes | memoryview | None]]:
    """(row, its image bytes) for the `wanted` rows of one shard, in row order: one pread each through the
    footer's byte index, or — for a shard without a usable one — from the row groups that hold them."""
    footer = pq.read_metadata(path)
    try:
        index = decode_image_index(footer.metadata, footer.num_rows, path)
        if index is not None:
            fd = os.open(path, os.O_RDONLY)
            try:
                yield from ((row, read_indexed(fd, index[row], path)) for row in sorted(wanted))
            finally:
                os.close(fd)
            return
    except FormatError:  # a damaged index: the scan reports it; the sheet reads the rows the slow way
        pass
    for start, blobs in iter_row_groups(path, wanted, footer):
        for row in sorted(r for r in wanted if start <= r < start + len(blobs)):
            blob = blobs[row - start]
            yield row, memoryview(blob.as_buffer()) if blob.is_valid else None


def draw_sheet(
    label_map: dict[str, Any],
    labels: list[int],
    picks: Picks,
    thumbs: dict[tuple[Path, int], Image.Image | None],
    per_class: int,
) -> Image.Image:
    """One row per shown class: caption, `per_class` train thumbnails, then `per_class` val thumbnails."""
    width = 2 * MARGIN + CAPTION_WIDTH + 2 * per_class * CELL + GAP
    sheet = Image.new("RGB", (width, HEADER + MARGIN + len(labels) * CELL), "white")
    draw, font = ImageDraw.Draw(sheet), ImageFont.load_default(size=13)
    x0 = {"train": MARGIN + CAPTION_WIDTH, "val": MARGIN + CAPTION_WIDTH + per_class * CELL + GAP}
    for split, x in x0.items():
        draw.text((x, 4), split, fill="black", font=font)
    classes = {c["label"]: c for c in label_map["classes"]}
    found = class_ids(label_map)  # the wnid, or the folder name of a dataset not named by wnids
    for line, label in enumerate(labels):
        y = HEADER + line * CELL
        cls = classes[label]
        draw.text((MARGIN, y + 6), f"{label}  {found[label][:28]}", fill="black", font=font)
        draw.text((MARGIN, y + 26), cls["name"][:34], fill="dimgray", font=font)
        for split, x in x0.items():
            rows = picks.get((split, label), [])
            for slot in range(per_class):
                box = (x + slot * CELL, y, x + slot * CELL + THUMB - 1, y + THUMB - 1)
                image = thumbs.get(rows[slot]) if slot < len(rows) else None
                _paste(sheet, draw, box, image, missing=slot >= len(rows))
    return sheet


def _paste(
    sheet: Image.Image,
    draw: ImageDraw.ImageDraw,
    box: tuple[int, int, int, int],
    image: Image.Image | None,
    missing: bool,
) -> None:
    draw.rectangle(box, fill="#eeeeee")
    if image is not None:
        sheet.paste(image, (box[0] + (THUMB - image.width) // 2, box[1] + (THUMB - image.height) // 2))
    elif not missing:  # a row whose bytes do not decode: a red cross
        draw.line(box, fill="red", width=2)
        draw.line((box[0], box[3], box[2], box[1]), fill="red", width=2)


def write_contact_sheet(
    parquet_dir: str | Path,
    label_map_path: str | Path,
    out_png: str | Path,
    per_class: int,
    max_classes: int,
    overlay_dir: str | Path | None = None,
) -> Path:
    """Write the contact sheet PNG atomically — of the merged view, the curation overlay in `overlay_dir` (None:
    `<parquet_dir>/../overlay`, where readers find it) applied; returns its path."""
    label_map = read_label_map(label_map_path)
    labels = shown_labels(label_map["num_classes"], max_classes)
    where = Path(overlay_dir) if overlay_dir is not None else Path(parquet_dir).parent / OVERLAY_DIR
    picks = select_rows(list_shards(parquet_dir), labels, per_class, {s: overlaid(where, s) for s in SPLITS})
    sheet = draw_sheet(label_map, labels, picks, read_thumbnails(picks), per_class)
    with atomic_path(out_png, path_key("reports")) as tmp:  # a 256-colour palette (median cut, dithered): thumbnails
        # read the same, the file is ~4x smaller (it is part of every version, curation-only ones included)
        sheet.quantize(256, method=Image.Quantize.MEDIANCUT).save(tmp, "PNG", optimize=True)
    return Path(out_png)
