"""What a reviewer acts on after the near-duplicate check: the pairs side by side (near_duplicates.png) and the
candidate exclude list (near_duplicates_exclude.csv) in the curation format `split,wnid,name,reason` — one row
per val image of a pair, sorted — ready to review and copy to the curation exclude list (params curate.exclude).
Both are deterministic (fixed layout, Pillow's built-in font, no PNG metadata; sorted CSV)."""

from __future__ import annotations

import csv
import io
import textwrap
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from tasks.common import atomic_path, write_text
from tasks.common.params import path_key
from tasks.validate.contact_sheet import THUMB, Picks, _paste, read_thumbnails

NEAR_DUPLICATES_PNG = "near_duplicates.png"
EXCLUDE_CSV = "near_duplicates_exclude.csv"
EXCLUDE_HEADER = ["split", "wnid", "name", "reason"]
MAX_PICTURED = 60  # pairs drawn (the first ones of the report's order: cross-class first, then by distance)
ROW, CAPTION_X, WIDTH = THUMB + 8, 2 * THUMB + 24, 2 * THUMB + 24 + 460


def exclude_rows(pairs: list[dict[str, Any]]) -> list[list[str]]:
    """One row per val image of a pair, naming its closest train image (then the first by name), sorted."""
    closest: dict[tuple[str, str], dict[str, Any]] = {}
    for pair in sorted(pairs, key=lambda p: (p["distance"], p["train_wnid"], p["train_name"])):
        closest.setdefault((pair["val_wnid"], pair["val_name"]), pair)
    rows = []
    for (wnid, name), pair in sorted(closest.items()):
        other = ", another class" if pair["cross_class"] else ""
        reason = (
            f"near-duplicate of train/{pair['train_wnid']}/{pair['train_name']} (distance {pair['distance']}{other})"
        )
        rows.append(["val", wnid, name, reason])
    return rows


def exclude_csv(pairs: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerows([EXCLUDE_HEADER, *exclude_rows(pairs)])
    return buf.getvalue()


def draw_pairs(
    pairs: list[dict[str, Any]], parquet_dir: Path, total: int, empty: str = "no near-duplicate pair"
) -> Image.Image:
    """One line per pair: val thumbnail, train thumbnail, names, classes and distance (cross-class in red);
    `empty` is what the picture says when there is none."""
    shown = pairs[:MAX_PICTURED]
    picks: Picks = {
        (split, i): [(parquet_dir / split / p[f"{split}_shard"], int(p[f"{split}_row"]))]
        for i, p in enumerate(shown)
        for split in ("val", "train")
    }
    thumbs = read_thumbnails(picks)
    sheet = Image.new("RGB", (WIDTH, 28 + max(1, len(shown)) * ROW), "white")
    draw, font = ImageDraw.Draw(sheet), ImageFont.load_default(size=13)
    title = f"{total} train/val near-duplicate pair(s)" + (f", first {len(shown)}" if total > len(shown) else "")
    draw.text((8, 6), title + "   (val | train)", fill="black", font=font)
    for i, pair in enumerate(shown):
        y = 28 + i * ROW
        for col, split in enumerate(("val", "train")):
            x = 8 + col * (THUMB + 8)
            _paste(sheet, draw, (x, y, x + THUMB - 1, y + THUMB - 1), thumbs.get(picks[split, i][0]), False)
        colour = "red" if pair["cross_class"] else "black"
        lines = [
            f"val   {pair['val_wnid']}/{pair['val_name']}",
            f"train {pair['train_wnid']}/{pair['train_name']}",
            f"distance {pair['distance']}" + ("   CROSS-CLASS: also a label problem" if pair["cross_class"] else ""),
        ]
        for k, text in enumerate(lines):
            draw.text((CAPTION_X, y + 4 + 20 * k), text, fill=colour, font=font)
    if not shown:
        draw.multiline_text((8, 34), textwrap.fill(empty, 88), fill="dimgray", font=font)
    return sheet


def write_near_duplicate_outputs(
    report: dict[str, Any], parquet_dir: str | Path, reports_dir: str | Path
) -> list[Path]:
    """near_duplicates.png and near_duplicates_exclude.csv under `reports_dir` (atomic), from the report's
    `near_duplicates` section (empty outputs when the check found nothing or could not run)."""
    near = report.get("near_duplicates", {})
    pairs = near.get("pairs", [])
    empty = "no near-duplicate pair" if near.get("checked", True) else f"not checked: {near['reason']}"
    out_png = Path(reports_dir) / NEAR_DUPLICATES_PNG
    with atomic_path(out_png, path_key("reports")) as tmp:
        draw_pairs(pairs, Path(parquet_dir), len(pairs), empty).save(tmp, "PNG")
    return [out_png, write_text(Path(reports_dir) / EXCLUDE_CSV, exclude_csv(pairs), path_key("reports"))]
