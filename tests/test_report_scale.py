"""The schema report at ImageNet-21k's class count (issue 22, item 3): built from the report's input structures
for 19,000 classes with every check failed, every class out of bounds, changed and curated, it stays readable:
<= 300 lines of Markdown, every failed check named with its message, summaries and the worst classes only."""
from __future__ import annotations

import pandas as pd
import pytest

from tasks.validate.checks import DESCRIPTIONS, CheckResult
from tasks.validate.dataset_checks import count_summary
from tasks.validate.report import build_report, render_markdown
from tests.helpers.params import validate_section

CLASSES = 19_000
MAX_LINES = 300


def _classes() -> pd.DataFrame:
    wnids = [f"n{c:08d}" for c in range(CLASSES)]
    # train: 0..2 images (bounds 1..1300: a third of the classes out of bounds), one far outside (label 7: 0)
    return pd.DataFrame({"label": range(CLASSES), "wnid": wnids, "name": wnids,
                         "train": [c % 3 for c in range(CLASSES)], "val": [60 + c % 5 for c in range(CLASSES)]})


def _results(examples: int, failed: int = len(DESCRIPTIONS)) -> list[CheckResult]:
    rows = [{"split": "train", "shard": "train-h0.parquet", "row": i, "image_path": f"n{i:08d}_0.JPEG",
             "label": i, "wnid": f"n{i:08d}"} for i in range(examples)]
    return [CheckResult(name, "fail", f"{name} failed on {CLASSES} rows (e.g. n00000000)", CLASSES, rows)
            if i < failed else CheckResult(name, "pass", "ok") for i, name in enumerate(DESCRIPTIONS)]


def _changes() -> dict[str, object]:
    rows = [{"wnid": f"n{c:08d}", "before": 3, "after": 2 + (c == 4321) * 40, "added": (c == 4321) * 40,
             "removed": 1 - (c == 4321), "relabelled_in": 0, "relabelled_out": 0} for c in range(CLASSES)]
    split = {"classes": rows, "shards_rewritten": [f"train-h{i:04x}.parquet" for i in range(5000)],
             "shards_removed": [], "shards": 5000}
    return {"previous": True, "label_map_changed": True, "train": split, "val": {**split, "classes": rows[:50]}}


def _curation() -> dict[str, object]:
    by_class = {f"n{c:08d}": 1 + (c == 99) for c in range(CLASSES)}
    found = {"by_reason": {"blurry": CLASSES, "near-duplicate of val": 3}, "by_class": by_class}
    return {"files": {"exclude": "curation/exclude.csv"}, "exclude": {"train": found, "val": found},
            "relabel": {"train": found}}


def _near(pairs: int) -> dict[str, object]:
    rows = [{"val_name": f"v{i}", "val_wnid": f"n{i:08d}", "val_label": i, "train_name": f"t{i}",
             "train_wnid": f"n{i + 1:08d}", "train_label": i + 1, "distance": 2, "cross_class": True}
            for i in range(pairs)]
    return {"checked": True, "distance": 8, "pairs": rows,
            "train_groups": {"groups": 7, "images": 15, "pairs": 9, "distance": 4}}


def _report(report_examples: int, failed: int = len(DESCRIPTIONS)) -> str:
    params = validate_section(report_examples=report_examples, train_count=[1, 1300], val_count=[1, 50])
    classes = _classes()
    counts = count_summary(classes, {"train": params.train_count, "val": params.val_count})
    bad = pd.DataFrame([{"split": "train", "source": "train.tar", "member": f"m{i}", "name": f"b{i}.JPEG",
                         "reason": f"reason {i % 40}"} for i in range(500)])
    splits = {s: {"rows": 57_000, "manifest_rows": 57_500, "quarantined": 500, "shards": 5000, "classes": CLASSES,
                  "image_bytes": 10**9, "decoded": 200} for s in ("train", "val")}
    label_map = {"num_classes": CLASSES, "label_source": "folder names"}
    report = build_report(_results(report_examples, failed), splits, classes, counts, bad, label_map, params)
    report.update(curation=_curation(), changes=_changes(), near_duplicates=_near(5000))
    return render_markdown(report)


@pytest.mark.parametrize("report_examples", [1, 10, 50])
def test_a_19000_class_report_with_every_check_failed_stays_within_300_lines(report_examples):
    for failed in (2, 6, 9, 15):  # a block of example rows per check while few fail, one table when many do
        some = _report(report_examples, failed)
        assert len(some.splitlines()) <= MAX_LINES, (failed, len(some.splitlines()))
        assert all(f"- **{name}** (fail)" in some for name in list(DESCRIPTIONS)[:failed])
    text = _report(report_examples)
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES, len(lines)
    assert text.startswith("# Schema and label validation: FAILED")
    for name in DESCRIPTIONS:  # every failed check named, with its message, in the summary and the examples
        assert f"- **{name}** (fail): {name} failed on {CLASSES} rows" in text
        assert f"| `{name}` | FAIL | {CLASSES} | split=train; shard=train-h0.parquet; row=0;" in text  # 1st example
    # the worst classes, not every class: the farthest out of bounds (val 64 > 50 by 14), the most changed
    shown = min(report_examples, 10)  # a per-class table: report_examples rows, at most 10
    assert f"Classes out of bounds ({shown} of {CLASSES // 3 + 1 + CLASSES}, farthest outside first):" in text
    assert "| val | 4 | n00000004 | n00000004 | 64 | 14 |" in text
    assert f"{CLASSES} class(es) changed: 40 image(s) added, {CLASSES - 1} removed, 0 relabelled." in text
    assert "| n00004321 | 3 | 42 | 40 | 0 | 0 | 0 |" in text  # the class that changed most, listed first
    assert f"5000 of 5000 shards rewritten (`train-h0000.parquet`" in text
    assert f"... and {5000 - shown} more); 0 removed." in text
    assert "n00000099 (2)" in text and f"... and {CLASSES - shown} more classes" in text
    assert max(len(line) for line in lines) < 3000  # no line listing every class or shard


@pytest.mark.parametrize("failed", [1, 3])
def test_few_failed_checks_keep_their_message_and_example_rows(failed):
    text = _report(10, failed)
    assert len(text.splitlines()) <= MAX_LINES
    for name in list(DESCRIPTIONS)[:failed]:
        block = text.split(f"### `{name}`: FAIL", 1)[1].split("###", 1)[0]
        assert f"{name} failed on {CLASSES} rows" in block
        assert "| train | train-h0.parquet | 9 | n00000009_0.JPEG | 9 | n00000009 |" in block  # all 10 rows
    assert "### `" + list(DESCRIPTIONS)[failed] + "`" not in text  # a passed check: no block
