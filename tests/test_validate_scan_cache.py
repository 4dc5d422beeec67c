"""validate keeps each shard's byte findings (tasks.validate.scan): a rerun over unchanged shards reads no image
byte and gives the same report as a full scan; a rewritten shard is scanned again and its new problem reported; a
damaged cache file is never trusted; a curation-only change scans no shard, its decode sample moving only where
a sampled row was excluded."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.validate import scan, stage
from tasks.validate.converted import CONVERTED_FILE, MANIFESTS_FILE
from tasks.validate.kept_metadata import METADATA_DIR
from tasks.validate.report import write_reports
from tasks.validate.scan import SCAN_DIR, decode_mask
from tasks.validate.stage import run_validation
from tests.helpers.datasets import Dataset, make_dataset, set_bytes, small_jpeg
from tests.helpers.overlays import write_test_overlay
from tests.helpers.params import validate_section


@pytest.fixture
def scans(monkeypatch) -> list[str]:
    """The shards scan_shard reads (split/name), in order."""
    seen: list[str] = []
    original = scan.scan_shard

    def counted(job: scan.ShardScan) -> scan.ByteFindings:
        seen.append(f"{job.split}/{job.path.name}")
        return original(job)

    monkeypatch.setattr(scan, "scan_shard", counted)
    return seen


def _dataset(tmp_path: Path) -> Dataset:
    """4 classes, 8 train + 2 val images each over 4 + 2 shards; a hash mismatch and a non-JPEG among them."""
    ds = make_dataset(tmp_path / "ds", classes=4, train_per_class=8, val_per_class=2)
    ds.shards = {"train": 4, "val": 2}
    set_bytes(ds.rows["train"][5], small_jpeg(999), rehash=False)
    set_bytes(ds.rows["val"][-1], b"GIF89a not a jpeg")
    return ds.write()


def _run(ds: Dataset, work: Path | None, **params: Any) -> dict[str, Any]:
    return run_validation(ds.parquet_dir, ds.manifests_dir, ds.label_map_path,
                          validate_section(**{"decode_sample": 6, **params}), ds.root / "overlay", work)


def _written(report: dict[str, Any], out: Path) -> dict[str, bytes]:
    """The files write_reports makes of `report` (what DVC hashes), by name."""
    write_reports(report, out / "reports", out / "metrics.json")
    return {p.name: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def test_a_rerun_reads_no_shard_and_reports_exactly_what_a_full_scan_does(tmp_path, scans):
    ds = _dataset(tmp_path)
    work = tmp_path / "work" / "validate"
    full = _run(ds, None)
    assert len(scans) == 6
    first = _run(ds, work)
    assert len(scans) == 12 and len(list((work / SCAN_DIR).glob("*/*.json"))) == 6
    again = _run(ds, work)
    assert len(scans) == 12  # every shard from the cache
    assert full == first == again
    assert _checks(again)["sha256_match"]["failures"] == 1 and _checks(again)["jpeg_soi"]["failures"] == 1
    assert _written(full, tmp_path / "full") == _written(again, tmp_path / "again")


def test_a_rewritten_shard_is_scanned_again_and_its_new_problem_reported(tmp_path, scans):
    ds = _dataset(tmp_path)
    work = tmp_path / "work" / "validate"
    assert _checks(_run(ds, work))["jpeg_soi"]["failures"] == 1
    shard = sorted((ds.parquet_dir / "train").glob("*.parquet"))[2]
    rows = pq.read_table(shard).to_pylist()
    set_bytes(rows[1], b"\x89PNG not a jpeg either")  # sha256 updated: only the bytes' kind is wrong
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(shard)), shard, row_group_size=4)
    write_test_overlay(ds.parquet_dir)  # the curate stage's overlay for the shards as they are now
    del scans[:]
    report = _run(ds, work)
    assert scans == [f"train/{shard.name}"]
    assert _checks(report)["jpeg_soi"]["failures"] == 2 and rows[1]["image"]["path"] in str(report["checks"])
    assert report == _run(ds, None)


def _wrong_key(doc: dict[str, Any]) -> None:
    doc["key"]["mtime_ns"] += 1


def _row_out_of_range(doc: dict[str, Any]) -> None:
    doc["findings"]["not_jpeg"] = [[99, "starts with 47 49"]]


def _row_twice(doc: dict[str, Any]) -> None:
    doc["findings"]["not_jpeg"] *= 2


def _text_count(doc: dict[str, Any]) -> None:
    doc["findings"]["image_bytes"]["val"] = "12"


@pytest.mark.parametrize("damage", ["not json {", "[1, 2]", "", _wrong_key, _row_out_of_range, _row_twice,
                                    _text_count])
def test_a_damaged_cache_file_is_not_trusted(tmp_path, scans, damage):
    ds = _dataset(tmp_path)
    work = tmp_path / "work" / "validate"
    expected = _run(ds, work)
    shard = sorted((ds.parquet_dir / "val").glob("*.parquet"))[-1]
    cached = work / SCAN_DIR / "val" / f"{shard.name}.json"
    doc = json.loads(cached.read_text())
    assert doc["findings"]["not_jpeg"]  # the non-JPEG is in the last val shard
    if callable(damage):
        damage(doc)
        damage = json.dumps(doc)
    cached.write_text(damage)
    (work / SCAN_DIR / "train" / "gone.parquet.json").write_text("{}")  # a shard no longer there
    del scans[:]
    assert _run(ds, work) == expected
    assert scans == [f"val/{shard.name}"]
    assert not (work / SCAN_DIR / "train" / "gone.parquet.json").exists()
    del scans[:]
    assert _run(ds, work) == expected and scans == []  # kept again, whole


def _shard_of(ds: Dataset) -> dict[tuple[str, str], str]:
    """(split, image name) -> split/shard name of every row."""
    found = {}
    for path in sorted(ds.parquet_dir.glob("*/*.parquet")):
        names = pq.ParquetFile(path).read(columns=["image.path"]).column("image").combine_chunks().field("path")
        found.update({(path.parent.name, n): f"{path.parent.name}/{path.name}" for n in names.to_pylist()})
    return found


def _names(mask: np.ndarray, meta: pd.DataFrame) -> set[tuple[str, str]]:
    return {(s, n) for s, n in meta.loc[mask, ["split", "image_path"]].itertuples(index=False)}


def test_a_curation_only_change_scans_no_shard_and_moves_the_sample_only_for_excluded_rows(
        tmp_path, scans, monkeypatch):
    ds = _dataset(tmp_path)
    work = tmp_path / "work" / "validate"
    samples: list[set[tuple[str, str]]] = []
    original = stage.scan_bytes

    def recorded(plan, meta, decode, *args, **kwargs):  # the decode sample, as image names
        samples.append(_names(decode, meta))
        return original(plan, meta, decode, *args, **kwargs)

    monkeypatch.setattr(stage, "scan_bytes", recorded)
    before = _run(ds, work)
    assert len(samples[0]) == 12 and before["splits"]["train"]["decoded"] == 6
    unsampled = [("train", r["image"]["path"]) for r in ds.rows["train"] if ("train", r["image"]["path"])
                 not in samples[0]][:3]
    write_test_overlay(ds.parquet_dir, exclude=set(unsampled))
    del scans[:]
    after = _run(ds, work)
    assert scans == [] and samples[1] == samples[0]
    assert after["splits"]["train"]["excluded"] == 3 and after["splits"]["train"]["decoded"] == 6
    assert after == _run(ds, None)

    sampled = sorted(n for n in samples[0] if n[0] == "train")[0]
    write_test_overlay(ds.parquet_dir, exclude={*unsampled, sampled})
    del scans[:]
    moved = _run(ds, work)
    gone, new = samples[0] - samples[-1], samples[-1] - samples[0]
    assert gone == {sampled} and len(new) == 1 and moved["splits"]["train"]["decoded"] == 6
    shard_of = _shard_of(ds)  # only the shards of the row that left the sample and of the one that came in
    assert sorted(scans) == sorted({shard_of[sampled], shard_of[next(iter(new))]})
    assert moved == _run(ds, None)


def test_the_decode_sample_is_stable_when_rows_leave_it():
    rng = np.random.default_rng(7)
    meta = pd.DataFrame({"split": ["train"] * 900 + ["val"] * 100,
                         "shard": [f"s{i // 100}" for i in range(1000)],
                         "row": [i % 100 for i in range(1000)]})
    for sample in (40, 0.05, "all", 0):
        full = decode_mask(meta, sample)
        assert (full == decode_mask(meta, sample)).all()  # deterministic
        counts = [int(full[: 900].sum()), int(full[900:].sum())]
        expected = {40: [40, 40], 0.05: [45, 5], "all": [900, 100], 0: [0, 0]}[sample]
        assert counts == expected
    full = decode_mask(meta, 40)
    out = rng.choice(np.flatnonzero(~full[:900]), 50, replace=False)  # rows outside the sample
    kept = meta.drop(index=out)
    assert (decode_mask(kept, 40) == full[kept.index]).all()
    sampled = rng.choice(np.flatnonzero(full[:900]), 3, replace=False)
    kept = meta.drop(index=[*out, *sampled])
    now = set(kept.index[decode_mask(kept, 40)])
    before = set(np.flatnonzero(full))
    assert before - now == set(sampled) and len(now - before) == 3


# ---------------------------------------------------------------- the checks of the shards as converted (converted.py)
@pytest.fixture
def converted_runs(monkeypatch) -> list[int]:
    """One entry per run of the checks of the shards as converted (schema, pandera), with its row count."""
    runs: list[int] = []
    original = stage._shard_checks

    def counted(meta, *args, **kwargs):
        runs.append(len(meta))
        return original(meta, *args, **kwargs)

    monkeypatch.setattr(stage, "_shard_checks", counted)
    return runs


def _mislabelled(tmp_path: Path) -> Dataset:
    """_dataset with a pandera failure: a label_name that is not its label's."""
    ds = make_dataset(tmp_path / "ds", classes=4, train_per_class=8, val_per_class=2)
    ds.shards = {"train": 4, "val": 2}
    ds.rows["train"][9]["label_name"] = "not its class"
    return ds.write()


def test_a_curation_round_keeps_the_checks_of_the_shards_as_converted(tmp_path, converted_runs):
    ds = _mislabelled(tmp_path)
    work = tmp_path / "work" / "validate"
    first = _run(ds, work)
    assert converted_runs == [40] and (work / CONVERTED_FILE).is_file()
    assert _checks(first)["name_matches_label"]["failures"] == 1
    assert _run(ds, work) == first and converted_runs == [40]
    names = [r["image"]["path"] for r in ds.rows["train"][:3]]
    write_test_overlay(ds.parquet_dir, exclude={("train", n) for n in names}, labels={("train", names[0]): 2})
    curated = _run(ds, work)
    assert converted_runs == [40]  # the overlay changed, no shard did
    assert curated["splits"]["train"]["excluded"] == 3 and _checks(curated)["name_matches_label"]["failures"] == 1
    assert curated == _run(ds, None) and converted_runs == [40, 40]
    assert _written(curated, tmp_path / "kept") == _written(_run(ds, None), tmp_path / "full")


def test_a_rewritten_shard_runs_the_checks_again_and_its_new_problem_is_reported(tmp_path, converted_runs):
    ds = _mislabelled(tmp_path)
    work = tmp_path / "work" / "validate"
    before = _run(ds, work)
    shard = sorted((ds.parquet_dir / "train").glob("*.parquet"))[3]
    rows = pq.read_table(shard).to_pylist()
    rows[0]["width"] = 0
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(shard)), shard, row_group_size=4)
    write_test_overlay(ds.parquet_dir)
    after = _run(ds, work)
    assert converted_runs == [40, 40]
    assert _checks(before)["positive_size"]["status"] == "pass" != _checks(after)["positive_size"]["status"]
    assert after == _run(ds, None)  # the version index's shard digests included


def _foreign_result(doc: dict[str, Any]) -> None:
    doc["results"][0]["name"] = "made_up_check"


def _passing_all(doc: dict[str, Any]) -> None:
    for result in doc["results"]:
        result.update(status="pass", failures=0, examples=[])
    doc["key"]["shards"][0]["mtime_ns"] += 1  # ... under a key that no longer matches


def _missing_field(doc: dict[str, Any]) -> None:
    del doc["results"][-1]["examples"]


def _digests_as_list(doc: dict[str, Any]) -> None:
    doc["extra"] = [doc["extra"]]


def _digest_as_number(doc: dict[str, Any]) -> None:
    doc["extra"]["train"] = {k: 1.5 for k in doc["extra"]["train"]}


@pytest.mark.parametrize("damage", ["not json {", "[]", "", _foreign_result, _passing_all, _missing_field,
                                    _digests_as_list, _digest_as_number])
def test_damaged_kept_checks_are_not_trusted(tmp_path, converted_runs, damage):
    ds = _mislabelled(tmp_path)
    work = tmp_path / "work" / "validate"
    expected = _run(ds, work)
    kept = work / CONVERTED_FILE
    if callable(damage):
        doc = json.loads(kept.read_text())
        damage(doc)
        damage = json.dumps(doc)
    kept.write_text(damage)
    assert _run(ds, work) == expected and len(converted_runs) == 2
    assert _run(ds, work) == expected and len(converted_runs) == 2  # kept again, whole


@pytest.fixture
def manifest_runs(monkeypatch) -> list[str]:
    runs: list[str] = []
    original = stage.manifest_label_check

    def counted(*args, **kwargs):
        runs.append("labels")
        return original(*args, **kwargs)

    monkeypatch.setattr(stage, "manifest_label_check", counted)
    return runs


def test_the_checks_against_the_manifests_are_kept_until_a_manifest_changes(tmp_path, converted_runs,
                                                                            manifest_runs):
    ds = _mislabelled(tmp_path)
    work = tmp_path / "work" / "validate"
    first = _run(ds, work)
    assert (work / MANIFESTS_FILE).is_file() and _checks(first)["labels_match_manifest"]["status"] == "pass"
    write_test_overlay(ds.parquet_dir, exclude={("train", ds.rows["train"][0]["image"]["path"])})
    assert _run(ds, work) == _run(ds, None) and manifest_runs == ["labels", "labels"]  # kept, then the run without
    ds.manifests["train"][4]["label"] = (ds.manifests["train"][4]["label"] + 1) % 4  # the manifest says otherwise
    ds.write()  # the shards are written again as they were: new inodes and mtimes
    write_test_overlay(ds.parquet_dir, exclude={("train", ds.rows["train"][0]["image"]["path"])})
    del converted_runs[:], manifest_runs[:]
    again = _run(ds, work)
    assert manifest_runs == ["labels"] and _checks(again)["labels_match_manifest"]["failures"] == 1
    assert again == _run(ds, None)
    kept = json.loads((work / MANIFESTS_FILE).read_text())
    manifest = ds.manifests_dir / "train.parquet"
    manifest.write_bytes(manifest.read_bytes())  # same bytes, new mtime: the manifests are keyed by content
    del manifest_runs[:]
    assert _run(ds, work) == again and manifest_runs == []
    assert json.loads((work / MANIFESTS_FILE).read_text()) == kept


# ---------------------------------------------------------------- each shard's metadata table (kept_metadata.py)
@pytest.fixture
def table_reads(monkeypatch) -> list[str]:
    """The shards whose metadata columns were read from the Parquet file (split/name)."""
    reads: list[str] = []
    original = scan._read_shard_metadata

    def counted(path, footer=None):
        reads.append(f"{path.parent.name}/{path.name}")
        return original(path, footer)

    monkeypatch.setattr(scan, "_read_shard_metadata", counted)
    return reads


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def _other_shard(path: Path) -> None:  # another shard's table, under this one's name
    other = sorted(path.parent.glob("*.arrow"))
    path.write_bytes(other[0 if other[0] != path else 1].read_bytes())


def _garbage(path: Path) -> None:
    path.write_bytes(b"ARROW1 but nothing else")


@pytest.mark.parametrize("damage", [_truncated, _other_shard, _garbage])
def test_kept_metadata_tables_are_reused_refreshed_and_never_trusted_damaged(tmp_path, table_reads, damage):
    ds = _dataset(tmp_path)
    work = tmp_path / "work" / "validate"
    expected = _run(ds, work)
    tables = sorted((work / METADATA_DIR).glob("*/*.arrow"))
    assert len(tables) == 6 and len(table_reads) == 6
    write_test_overlay(ds.parquet_dir, exclude={("train", ds.rows["train"][1]["image"]["path"])})
    curated = _run(ds, work)
    assert len(table_reads) == 6 and curated == _run(ds, None)  # none read again, then all six without work
    del table_reads[:]
    damage(tables[0])
    (work / METADATA_DIR / "train" / "gone.parquet.arrow").write_bytes(tables[1].read_bytes())
    assert _run(ds, work) == curated
    assert table_reads == [f"{tables[0].parent.name}/{tables[0].stem}"]
    assert not (work / METADATA_DIR / "train" / "gone.parquet.arrow").exists()
    del table_reads[:]
    assert _run(ds, work) == curated and table_reads == []
    assert expected["splits"]["train"]["excluded"] == 0 != curated["splits"]["train"]["excluded"]
