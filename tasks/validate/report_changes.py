"""The report's Markdown tables and its per-class sections, bounded at any class count (ImageNet-21k: ~19,000
classes, ~5,000 shards): summaries and the classes that changed most, never one row per class. The full lists stay
in schema_report.json (`changes`, `curation`, `classes`) and versions/index.json."""

from __future__ import annotations

from typing import Any

from tasks.common import SPLITS

TABLE_ROWS = 10  # rows of a per-class (or per-pair) table at most, whatever report_examples asks
CHANGE_COLUMNS = ["wnid", "before", "after", "added", "removed", "relabelled_in", "relabelled_out"]


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows] + [""]


def table_rows(report: dict[str, Any]) -> int:
    """Rows of a list table in the Markdown (classes, pairs, bad images): report_examples, at most TABLE_ROWS."""
    return min(int(report.get("params", {}).get("report_examples", TABLE_ROWS)), TABLE_ROWS)


def shown_names(names: list[str], limit: int) -> str:
    """The first `limit` names in backticks, then how many more (or 'none')."""
    shown = ", ".join(f"`{n}`" for n in names[:limit]) or "none"
    return shown + (f", ... and {len(names) - limit} more" if len(names) > limit else "")


def _moved(row: dict[str, Any]) -> int:
    return int(row["added"] + row["removed"] + row["relabelled_in"] + row["relabelled_out"])


def _curation_section(report: dict[str, Any]) -> list[str]:
    """The curation lines the curate stage applied (params.yaml curate:, the overlay's curation.json), by reason,
    with the classes they touch most (the first report_examples by images, then by name), and the lines naming
    images convert quarantined (nothing to apply)."""
    cur, limit = report.get("curation") or {}, table_rows(report)
    rows = []
    for kind in ("exclude", "relabel"):
        for split in SPLITS:
            found = cur.get(kind, {}).get(split, {})
            by_class = sorted(found.get("by_class", {}).items(), key=lambda item: (-item[1], item[0]))
            classes = ", ".join(f"{c} ({k})" for c, k in by_class[:limit])
            more = f", ... and {len(by_class) - limit} more classes" if len(by_class) > limit else ""
            rows += [
                [kind, split, reason, n, classes + more] for reason, n in sorted(found.get("by_reason", {}).items())
            ]
    files = ", ".join(f"{k}: `{v}`" for k, v in sorted((cur.get("files") or {}).items()))
    lines = ["## Curation applied", "", f"Files: {files or 'none'}.", ""]
    lines += _table(["kind", "split", "reason", "images", "classes"], rows) if rows else ["No lines.", ""]
    absent = [f"{x['split']}/{x['wnid']}/{x['name']}" for x in cur.get("not_in_shards") or []]
    if absent:
        quarantined = "image(s) convert quarantined (bad_images.jsonl): nothing to apply"
        lines += [f"{len(absent)} line(s) name {quarantined} — {shown_names(absent, limit)}.", ""]
    return lines


def _changes_section(report: dict[str, Any]) -> list[str]:
    """Changes since the previous version (versions/index.json): per split the shards rewritten, the images
    added / removed / relabelled over all classes, and the classes that changed most."""
    changes, limit = report.get("changes"), table_rows(report)
    lines = ["## Changes since the previous version", ""]
    if not changes or not changes["previous"]:
        return lines + ["No previous version recorded (versions/index.json): this is the first.", ""]
    if changes["label_map_changed"]:
        lines += ["The class set changed: label ids after the change moved, every shard carries the new map.", ""]
    for split in SPLITS:
        c = changes[split]
        count = f"{len(c['shards_rewritten'])} of {c['shards']} shards rewritten"
        shards = f"{shown_names(c['shards_rewritten'], limit)}); {len(c['shards_removed'])} removed."
        lines += [f"**{split}**: {count} ({shards}", ""]
        if c["classes"]:
            lines += _class_changes(c["classes"], limit)
    return lines


def _class_changes(classes: list[dict[str, Any]], limit: int) -> list[str]:
    totals = {k: sum(row[k] for row in classes) for k in CHANGE_COLUMNS[3:]}
    worst = sorted(classes, key=lambda row: (-_moved(row), str(row["wnid"])))[:limit]
    lines = [
        f"{len(classes)} class(es) changed: {totals['added']} image(s) added, {totals['removed']} removed, "
        f"{totals['relabelled_out']} relabelled."
        + (f" The {len(worst)} that changed most (all: schema_report.json `changes`):" if len(classes) > limit else ""),
        "",
    ]
    return lines + _table(CHANGE_COLUMNS, [[row[k] for k in CHANGE_COLUMNS] for row in worst])
