"""The validation report: one JSON-ready dict, rendered as Markdown, plus the class-count CSV and DVC metrics.

The Markdown's tables and its per-class sections are bounded at any class count (ImageNet-21k: ~19,000 classes,
~5,000 shards): summaries and the classes that changed most, never one row per class. The full lists stay in
schema_report.json (`changes`, `curation`, `classes`) and versions/index.json."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pandas as pd

from imagenet_parquet.format import FIELDS
from tasks.common import SPLITS, write_json, write_text
from tasks.common.layout import REPORT_MD
from tasks.common.params import ValidateParams, output_keys, path_key
from tasks.validate.checks import CheckResult

REPORT_JSON = "schema_report.json"
CLASS_COUNTS_CSV = "class_counts.csv"
CONTACT_SHEET = "contact_sheet.png"
EXAMPLE_LINES = 90  # the example rows of every failed check together: the report stays <= 300 lines
STATUS_WORD = {"pass": "PASSED", "warn": "PASSED with warnings", "fail": "FAILED"}
TABLE_ROWS = 10  # rows of a per-class (or per-pair) table at most, whatever report_examples asks
CHANGE_COLUMNS = ["wnid", "before", "after", "added", "removed", "relabelled_in", "relabelled_out"]


def plain(value: Any) -> Any:
    """JSON-ready copy: numpy scalars to Python, tuples to lists, recursively."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value.item() if hasattr(value, "item") else value


def build_report(
    results: list[CheckResult],
    splits: dict[str, dict[str, int]],
    classes: pd.DataFrame,
    counts: dict[str, Any],
    bad: pd.DataFrame,
    label_map: dict[str, Any],
    params: ValidateParams,
) -> dict[str, Any]:
    """Everything the reviewer reads, deterministic (no timestamps)."""
    statuses = {r.status for r in results}
    status = "fail" if "fail" in statuses else "warn" if "warn" in statuses else "pass"
    report: dict[str, Any] = plain(
        {
            "status": status,
            "params": params.model_dump(include=set(output_keys("validate"))),  # not workers: same report
            "schema": {
                "columns": [{"name": n, "type": str(t)} for n, t in FIELDS],
                "metadata": ["huggingface", "imagenet_parquet"],
            },
            "label_map": {"num_classes": label_map["num_classes"], "label_source": label_map.get("label_source")},
            "splits": splits,
            "class_counts": counts,
            "classes": classes.to_dict("records"),
            "bad_images": {
                "count": len(bad),
                "by_reason": bad["reason"].value_counts().sort_index().to_dict(),
                "examples": bad.head(params.report_examples).to_dict("records"),
            },
            "checks": [r.as_dict() for r in results],
            "contact_sheet": CONTACT_SHEET,
        }
    )
    return report


def failure_summary(report: dict[str, Any], reports_dir: Path) -> str:
    """The short text a failed stage ends with: one line per failed check."""
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    lines = [
        f"validation failed: {len(failed)} check(s) failed (full report with example rows: {reports_dir / REPORT_MD})"
    ]
    lines += [f"  - {c['name']}: {c['message']}" for c in failed]
    return "\n".join(lines)


def metrics(report: dict[str, Any]) -> dict[str, Any]:
    """The DVC metrics: counts per split, class-count summary, bad images, leakage, check outcomes."""
    out: dict[str, Any] = {}
    for split in SPLITS:
        counts = report["class_counts"][split]
        out[split] = {
            **report["splits"][split],
            "class_min": counts["min"],
            "class_median": counts["median"],
            "class_max": counts["max"],
            "classes_out_of_bounds": len(counts["out_of_bounds"]),
        }
    checks = {c["name"]: c for c in report["checks"]}
    out["bad_images"] = report["bad_images"]["count"]
    out["leakage_pairs"] = checks["leakage"]["failures"]
    if "near_duplicates" in checks:  # null when not checked (no fingerprints): no count, rather than a false 0
        checked = report.get("near_duplicates", {}).get("checked", True)
        out["near_duplicate_pairs"] = checks["near_duplicates"]["failures"] if checked else None
    out["checks"] = {
        status: sum(c["status"] == status for c in report["checks"]) for status in ("pass", "warn", "fail")
    }
    return out


def class_counts_csv(report: dict[str, Any]) -> str:
    """Long format (split, label, wnid, name, count) for `dvc plots`: one bar per class and split."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["split", "label", "wnid", "name", "count"])
    for split in SPLITS:
        for row in report["classes"]:
            writer.writerow([split, row["label"], row["wnid"], row["name"], row[split]])
    return buf.getvalue()


def write_reports(report: dict[str, Any], reports_dir: Path, metrics_path: Path) -> list[Path]:
    """schema_report.json / .md, class_counts.csv under `reports_dir`, and the metrics JSON (all atomic)."""
    written = [
        write_json(reports_dir / REPORT_JSON, report, path_key("reports")),
        write_json(metrics_path, metrics(report), path_key("metrics")),
    ]
    for name, text in ((REPORT_MD, render_markdown(report)), (CLASS_COUNTS_CSV, class_counts_csv(report))):
        written.append(write_text(reports_dir / name, text, path_key("reports")))
    return written


# ---------------------------------------------------------------- Markdown
def render_markdown(report: dict[str, Any]) -> str:
    lines = [f"# Schema and label validation: {STATUS_WORD[report['status']]}", ""]
    lines += _summary_section(report) + _counts_section(report) + _checks_section(report)
    lines += _examples_section(report) + _bad_images_section(report) + _near_duplicates_section(report)
    lines += _schema_section(report) + _curation_section(report) + _changes_section(report)
    return "\n".join(lines).rstrip() + "\n"


def _summary_section(report: dict[str, Any]) -> list[str]:
    checks = report["checks"]
    n = {s: sum(c["status"] == s for c in checks) for s in ("pass", "warn", "fail")}
    lines = [
        (
            f"{len(checks)} checks: {n['pass']} passed, {n['warn']} warning(s), {n['fail']} failed. "
            f"Label map: {report['label_map']['num_classes']} classes ({report['label_map']['label_source']})."
        ),
        "",
    ]
    lines += [f"- **{c['name']}** ({c['status']}): {c['message']}" for c in checks if c["status"] != "pass"]
    lines += [
        "",
        (
            "Contact sheet (a few images per class, train | val — a shifted val labelling shows at a "
            f"glance): [{report['contact_sheet']}]({report['contact_sheet']})"
        ),
        "",
    ]
    return lines


def _counts_section(report: dict[str, Any]) -> list[str]:
    lines = ["## Counts per split", ""]
    header = ["split", "shards", "rows", "manifest rows", "quarantined", "excluded", "relabelled", "classes"]
    keys = [k.replace(" ", "_") for k in header[1:]]  # rows: in the shards; excluded / relabelled: by the overlay
    lines += _table(
        [*header, "image MB", "decoded"],
        [
            [s, *(v.get(k, 0) for k in keys), f"{v['image_bytes'] / 1e6:.1f}", v["decoded"]]
            for s, v in report["splits"].items()
        ],
    )
    lines += ["## Images per class", ""]
    counts = report["class_counts"]
    lines += _table(
        ["split", "min", "median", "max", "bounds (params)", "classes out of bounds"],
        [
            [s, c["min"], c["median"], c["max"], f"{c['bounds'][0]}..{c['bounds'][1]}", len(c["out_of_bounds"])]
            for s, c in counts.items()
        ],
    )
    outside = sorted(
        (
            [s, r["label"], r["wnid"], r["name"], r["count"], _beyond(r["count"], c["bounds"])]
            for s, c in counts.items()
            for r in c["out_of_bounds"]
        ),
        key=lambda row: (-row[5], row[0], row[1]),
    )
    if outside:
        shown = outside[: table_rows(report)]
        lines += [f"Classes out of bounds ({len(shown)} of {len(outside)}, farthest outside first):", ""]
        lines += _table(["split", "label", "wnid", "name", "count", "outside by"], shown)
    return lines


def _beyond(count: int, bounds: list[int]) -> int:
    """How many images a class count lies outside its bounds."""
    return max(bounds[0] - count, count - bounds[1], 0)


def _checks_section(report: dict[str, Any]) -> list[str]:
    return ["## Checks", ""] + _table(
        ["check", "status", "what it checks", "failures"],
        [[f"`{c['name']}`", c["status"].upper(), c["description"], c["failures"]] for c in report["checks"]],
    )


def _examples_section(report: dict[str, Any]) -> list[str]:
    """Per failed check or warning its message and example rows: all report_examples of them while few checks
    fail, fewer when many do; when not even one row each fits in EXAMPLE_LINES, one table of every such check
    with its first example row (the messages are in the summary above)."""
    shown = [check for check in report["checks"] if check["status"] != "pass"]
    if not shown:
        return []
    rows = min(report["params"]["report_examples"], EXAMPLE_LINES // len(shown) - 10)
    lines = ["## Failed checks and warnings (example rows)", ""]
    if rows < 1:
        first = [[f"`{c['name']}`", c["status"].upper(), c["failures"], _row_text(c["examples"][:1])] for c in shown]
        return lines + _table(["check", "status", "failures", "first example (all: schema_report.json)"], first)
    for check in shown:
        lines += [f"### `{check['name']}`: {check['status'].upper()}", "", check["message"], ""]
        if check["examples"]:
            examples = check["examples"][:rows]
            header = list(dict.fromkeys(k for row in examples for k in row))
            lines += _table(header, [[row.get(k) for k in header] for row in examples])
            if len(check["examples"]) > rows:
                lines += [f"({len(examples)} of {len(check['examples'])} example rows: schema_report.json)", ""]
    return lines


def _row_text(rows: list[dict[str, Any]]) -> str:
    return "; ".join(f"{k}={v}" for row in rows for k, v in row.items())


def _bad_images_section(report: dict[str, Any]) -> list[str]:
    bad = report["bad_images"]
    lines = ["## Bad images from conversion (quarantined)", "", f"{bad['count']} image(s) in bad_images.jsonl.", ""]
    if bad["count"]:
        reasons = sorted(bad["by_reason"].items(), key=lambda item: (-item[1], item[0]))
        lines += _table(["reason", "images"], [[r, n] for r, n in reasons[: table_rows(report)]])
        examples = bad["examples"][: table_rows(report)]
        header = list(dict.fromkeys(k for row in examples for k in row))
        lines += _table(header, [[row.get(k) for k in header] for row in examples])
    return lines


def _near_duplicates_section(report: dict[str, Any]) -> list[str]:
    """The train/val near-duplicate pairs (the first report_examples x 5), with the picture and the exclude list."""
    near = report.get("near_duplicates")
    if not near:
        return []
    if not near["checked"]:
        return ["## Near-duplicates (perceptual fingerprint `phash`)", "", f"**Not checked**: {near['reason']}.", ""]
    pairs, groups = near["pairs"], near["train_groups"]
    lines = [
        "## Near-duplicates (perceptual fingerprint `phash`)",
        "",
        (
            f"{len(pairs)} train/val pair(s) within Hamming distance {near['distance']} of 64 bits "
            f"({sum(p['cross_class'] for p in pairs)} across classes, flagged: also a label problem). "
            f"Inside train: {groups['groups']} group(s) of {groups['images']} images within distance "
            f"{groups['distance']}."
        ),
        "",
    ]
    if pairs:
        lines += [
            (
                "Pairs side by side: [near_duplicates.png](near_duplicates.png). Candidate exclude list (review, "
                "then copy to the curation exclude list, params `curate.exclude`): "
                "[near_duplicates_exclude.csv](near_duplicates_exclude.csv)."
            ),
            "",
        ]
        shown = pairs[: 2 * table_rows(report)]
        lines += _table(
            ["val name", "val class", "train name", "train class", "distance", "cross-class"], _pair_rows(shown)
        )
        if len(pairs) > len(shown):
            lines += [f"... and {len(pairs) - len(shown)} more (schema_report.json, near_duplicates_exclude.csv).", ""]
    return lines


def _pair_rows(pairs: list[dict[str, Any]]) -> list[list[Any]]:
    keys = ["val_name", "val_wnid", "train_name", "train_wnid", "distance"]
    return [[p[k] for k in keys] + ["**yes**" if p["cross_class"] else ""] for p in pairs]


def _schema_section(report: dict[str, Any]) -> list[str]:
    lines = ["## Schema", ""] + _table(
        ["column", "Arrow type"], [[f"`{c['name']}`", f"`{c['type']}`"] for c in report["schema"]["columns"]]
    )
    lines += [f"Schema metadata: {', '.join(f'`{k}`' for k in report['schema']['metadata'])}.", ""]
    return lines + ["Params (`validate:`): " + ", ".join(f"`{k}={v}`" for k, v in report["params"].items()), ""]


# ---------------------------------------------------------------- Markdown: tables, curation and changes
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
    appended = "new_classes" in changes  # an append round (issue 33): new shards, the overlay gives the labels
    if changes["label_map_changed"]:
        carried = "the overlay gives each row's label in the new map" if appended else "every shard carries the new map"
        lines += [f"The class set changed: label ids after the change moved, {carried}.", ""]
    if appended and changes["new_classes"]:
        lines += [f"New classes: {shown_names(changes['new_classes'], limit)}.", ""]
    for split in SPLITS:
        c = changes[split]
        count = f"{len(c['shards_rewritten'])} of {c['shards']} shards rewritten"
        shards = f"{shown_names(c['shards_rewritten'], limit)}); {len(c['shards_removed'])} removed."
        lines += [f"**{split}**: {count} ({shards}", ""]
        if "source" in c:
            src = c["source"]
            added = f"{len(c['shards_added'])} shard(s) added ({shown_names(c['shards_added'], limit)})"
            images = (
                f"{src['appended']} image(s) appended, {src['removed']} removed from the source, "
                f"{src['replaced']} replaced by a newer version (overlay exclusions)"
            )
            lines += [f"{added}: {images}.", ""]
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
