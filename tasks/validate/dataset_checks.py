"""Dataset-level checks: class set and per-class counts, manifest totals and labels, train/val leakage."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from imagenet_parquet.format import class_ids
from tasks.common import SPLITS
from tasks.validate.checks import CheckResult, example_rows, passed


def class_table(meta: pd.DataFrame, label_map: dict[str, Any]) -> pd.DataFrame:
    """One row per label-map class: label, wnid (the class as found: the folder name of a dataset not named by
    wnids), name and its image count per split (0 when absent)."""
    classes = [{"label": c["label"], "name": c["name"]} for c in label_map["classes"]]
    table = pd.DataFrame([{**c, "wnid": key} for c, key in zip(classes, class_ids(label_map), strict=True)])
    counts = meta.groupby(["split", "label"]).size()
    for split in SPLITS:
        per_label = counts[split] if split in counts.index.get_level_values(0) else pd.Series(dtype=int)
        table[split] = table["label"].map(per_label).fillna(0).astype(np.int64)
    return table


def count_summary(table: pd.DataFrame, bounds: dict[str, list[int]]) -> dict[str, dict[str, Any]]:
    """min / median / max images per class and the classes outside the params bounds, per split."""
    summary = {}
    for split in SPLITS:
        low, high = bounds[split]
        outside = table[(table[split] < low) | (table[split] > high)]
        summary[split] = {
            "min": int(table[split].min()),
            "median": float(table[split].median()),
            "max": int(table[split].max()),
            "bounds": [low, high],
            "out_of_bounds": [
                {"label": int(r["label"]), "wnid": r["wnid"], "name": r["name"], "count": int(r[split])}
                for r in outside.to_dict("records")
            ],
        }
    return summary


def _class_text(row: dict[str, Any]) -> str:
    return f"label {row['label']} {row['wnid']} {row['name']!r}"


def class_set_check(table: pd.DataFrame, limit: int, holdout: dict[str, Any] | None = None) -> CheckResult:
    """Every label-map class has images in both train and val. `holdout`: the extract report's `holdout` section
    when val was held out of train (params extract.holdout): a class with train images and no val image is then a
    warning (a small class holds out none at a small fraction), a class with no train image still fails."""
    no_train, no_val = table["train"] == 0, table["val"] == 0
    absent = table[no_train | (no_val & (holdout is None))]
    if not absent.empty:
        return _class_set_failure(absent, limit)
    if holdout is not None and no_val.any():
        missed = table[no_val]
        first = _record(missed.iloc[0])
        message = (
            f"{len(missed)} class(es) have no held-out val image: holdout fraction {holdout['fraction']} "
            f"(params.yaml extract.holdout); expected at small classes — e.g. {_class_text(first)} "
            f"(train has {first['train']}); raise the fraction to give them val images"
        )
        return CheckResult("class_set", "warn", message, len(missed), missed.head(limit).to_dict("records"))
    return passed("class_set", f"train and val both hold all {len(table)} classes")


def _record(row: pd.Series) -> dict[str, Any]:
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in row.to_dict().items()}


def _class_set_failure(absent: pd.DataFrame, limit: int) -> CheckResult:
    first = _record(absent.iloc[0])
    where = " and ".join(s for s in SPLITS if first[s] == 0)
    others = ", ".join(f"{s} has {first[s]}" for s in SPLITS if first[s] != 0)
    message = (
        f"{len(absent)} class(es) missing from a split — e.g. {_class_text(first)} has no {where} images"
        f"{' (' + others + ')' if others else ''}; expected every class of label_map.json in train and "
        "val: check the extract stage's val labels (params extract.val_labels)"
    )
    return CheckResult("class_set", "fail", message, len(absent), absent.head(limit).to_dict("records"))


def class_count_check(table: pd.DataFrame, summary: dict[str, dict[str, Any]], limit: int) -> CheckResult:
    """Images per class within [min, max] of params validate.<split>_count."""
    outside = [{"split": split, **row} for split in SPLITS for row in summary[split]["out_of_bounds"]]
    if not outside:
        return passed(
            "class_counts",
            "; ".join(
                f"{s}: {summary[s]['min']}..{summary[s]['max']} per class within {summary[s]['bounds']}" for s in SPLITS
            ),
        )
    first = outside[0]
    low, high = summary[first["split"]]["bounds"]
    message = (
        f"{len(outside)} class count(s) out of bounds — e.g. {first['split']} label {first['label']} "
        f"{first['wnid']} {first['name']!r} has {first['count']} images, expected {low}..{high} "
        f"(params.yaml validate.{first['split']}_count): fix the data or the bounds"
    )
    return CheckResult("class_counts", "fail", message, len(outside), outside[:limit])


def manifest_check(
    meta: pd.DataFrame, manifests: dict[str, pd.DataFrame], bad: pd.DataFrame, limit: int
) -> tuple[CheckResult, dict[str, dict[str, int]]]:
    """Rows per split = manifest rows - quarantined, with exactly the manifest's (non-quarantined) images: as many
    rows of each name as the manifest holds less those quarantined (one name may be in every class: `0001.jpg`;
    which class each row belongs to is labels_match_manifest's)."""
    totals, problems, examples = {}, [], []
    for split in SPLITS:
        quarantined = bad.loc[bad["split"] == split, "name"]
        found = meta.loc[meta["split"] == split, "image_path"]
        missing, extra, expected = _name_difference(manifests[split]["name"], quarantined, found)
        totals[split] = {"rows": len(found), "manifest_rows": len(manifests[split]), "quarantined": len(quarantined)}
        if len(found) != expected or missing or extra:
            problems.append(
                f"{split}: {len(found)} rows, expected {expected} = {len(manifests[split])} "
                f"manifest rows - {totals[split]['quarantined']} quarantined; missing {missing[:3]}, "
                f"unexpected {extra[:3]}"
            )
        examples += [
            {"split": split, "image_path": n, "found": "in the manifest, not in the Parquet shards"}
            for n in missing[:limit]
        ]
        examples += [
            {"split": split, "image_path": n, "found": "in the Parquet shards, not in the manifest (or quarantined)"}
            for n in extra[:limit]
        ]
    if not problems:
        return passed(
            "manifest_totals",
            "; ".join(f"{s}: {t['rows']} = {t['manifest_rows']} - {t['quarantined']}" for s, t in totals.items()),
        ), totals
    return CheckResult(
        "manifest_totals", "fail", " | ".join(problems) + "; re-run the convert stage", len(examples), examples[:limit]
    ), totals


def _name_difference(names: pd.Series, quarantined: pd.Series, found: pd.Series) -> tuple[list[str], list[str], int]:
    """(names missing from `found`, names in excess, rows expected): the manifest's names less the quarantined
    ones, as sets when the manifest's names are unique (ImageNet), else as counts (`0001.jpg` in every class)."""
    expected = set(names)
    if len(expected) == len(names):
        expected -= set(quarantined)
        seen = set(found)
        return sorted(expected - seen), sorted(seen - expected), len(expected)
    counts = names.value_counts().sub(quarantined.value_counts(), fill_value=0).clip(lower=0)
    diff = counts.sub(found.value_counts(), fill_value=0)
    return sorted(diff.index[diff > 0]), sorted(diff.index[diff < 0]), int(counts.sum())


IMAGE_KEY = ["split", "name", "label"]  # an image: its name within its class (the label) of a split


def manifest_label_check(meta: pd.DataFrame, manifests: dict[str, pd.DataFrame], limit: int) -> CheckResult:
    """Each Parquet row's label equals the manifest's label for the same image: by name where a split's names are
    unique (ImageNet), else by counts of (name, label) (`0001.jpg` in every class: _label_counts_check)."""
    manifest = pd.concat([m[IMAGE_KEY] for m in manifests.values()], ignore_index=True)
    rows = meta[["split", "image_path", "label"]].rename(columns={"image_path": "name"})
    # names unique in each split (ImageNet): each row's label against its image's. Checked per split with a hash
    # table (merge's validate="m:1" builds a sorted MultiIndex: 5 of 7 s at 1.33 M rows)
    if not all(m["name"].is_unique for m in manifests.values()):
        return _label_counts_check(meta, rows, manifest, limit)
    merged = rows.reset_index().merge(manifest, on=["split", "name"], suffixes=("", "_manifest"))
    wrong = merged[merged["label"] != merged["label_manifest"]]
    detail = {int(r.index): f"label {r.label}, the manifest says {r.label_manifest}" for r in wrong.itertuples()}
    return _label_result(meta, detail, len(merged), limit)


def _label_counts_check(meta: pd.DataFrame, rows: pd.DataFrame, manifest: pd.DataFrame, limit: int) -> CheckResult:
    """labels_match_manifest where one name is in several classes: a (split, name, label) may have as many rows as
    the manifest holds; a row beyond them is relabelled, and should have had a label of that name the shards lack."""
    rows = rows.assign(nth=rows.groupby(IMAGE_KEY, sort=False).cumcount())
    allowed = manifest.groupby(IMAGE_KEY, sort=False).size().rename("allowed")
    rows = rows.join(allowed, on=IMAGE_KEY)
    wrong = rows[rows["nth"] >= rows["allowed"].fillna(0)]
    known = manifest[manifest["name"].isin(set(wrong["name"]))]
    pairs = set(zip(known["split"], known["name"], strict=True))  # a name the manifest lacks is manifest_totals'
    wrong = wrong[[key in pairs for key in zip(wrong["split"], wrong["name"], strict=True)]]
    if wrong.empty:
        return _label_result(meta, {}, len(rows), limit)
    said = _manifest_says(known, rows[rows["name"].isin(set(wrong["name"]))])
    detail = {
        int(r.Index): f"label {r.label}, the manifest says {said[r.split, r.name]}"
        if (r.split, r.name) in said
        else f"label {r.label}, more rows of that name and label than the manifest holds"
        for r in wrong.itertuples()
    }
    return _label_result(meta, detail, len(rows), limit)


def _label_result(meta: pd.DataFrame, detail: dict[int, str], compared: int, limit: int) -> CheckResult:
    if not detail:
        return passed("labels_match_manifest", f"{compared} rows agree with the manifests")
    first = min(detail)
    return CheckResult(
        "labels_match_manifest",
        "fail",
        f"{len(detail)} row(s) relabelled — e.g. {meta.at[first, 'split']} "
        f"{meta.at[first, 'image_path']!r}: {detail[first]}; re-run the convert stage",
        len(detail),
        example_rows(meta, list(detail), limit, detail),
    )


def _manifest_says(manifest: pd.DataFrame, rows: pd.DataFrame) -> dict[tuple[str, str], str]:
    """(split, name) -> the manifest's labels of that name that the shards hold fewer rows of."""
    expected = manifest.groupby(IMAGE_KEY).size()
    found = rows.groupby(IMAGE_KEY).size().reindex(expected.index, fill_value=0)
    short = expected[expected > found].reset_index()
    return {
        key: " or ".join(str(label) for label in sorted(group["label"]))
        for key, group in short.groupby(["split", "name"])
    }


def leakage_check(meta: pd.DataFrame, max_pairs: int, limit: int) -> CheckResult:
    """Pairs (train image, val image) with identical bytes: a warning up to `max_pairs`, a failure above."""
    cols = ["sha256", "image_path", "label"]
    train = meta.loc[meta["split"] == "train", cols]
    val = meta.loc[meta["split"] == "val", cols]
    pairs = train.merge(val, on="sha256", suffixes=("_train", "_val")).sort_values(
        ["image_path_train", "image_path_val"]
    )
    if pairs.empty:
        return passed("leakage", "no image is in both train and val")
    status = "warn" if len(pairs) <= max_pairs else "fail"
    first = pairs.iloc[0]
    message = (
        f"{len(pairs)} train/val pair(s) with identical bytes (tolerated: {max_pairs}, params.yaml "
        f"validate.leakage_max_pairs) — e.g. train {first['image_path_train']!r} = val "
        f"{first['image_path_val']!r}"
    )
    examples = [
        {k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()} for r in pairs.head(limit).to_dict("records")
    ]
    return CheckResult("leakage", status, message, len(pairs), examples)
