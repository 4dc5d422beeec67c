"""Near-duplicate leakage: the fingerprint, the banded search (against brute force), and planted near-duplicates
in a folder-mode tree through extract -> convert -> validate (found, warned or failed naming the file, pictured,
listed in the curation exclude format); the 1000 distinct real samples give no pair."""
from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from imagenet_parquet.format import FINGERPRINT_ALGORITHM
from tasks.common import PipelineError
from tasks.convert.distribute import run_local
from tasks.convert.fingerprint import fingerprint, stored_fingerprint
from tasks.convert.imaging import BadImage
from tasks.convert.job import job_from_params
from tasks.curate import lines as curation_lines
from tasks.curate import stage as curate
from tasks.extract import stage as extract
from tasks.validate.near_dup import (EXCLUDE_CSV, EXCLUDE_HEADER, NEAR_DUPLICATES_PNG, band_plan, near_duplicate_check,
                                     near_pairs, popcount, write_near_duplicate_outputs)
from tasks.validate.report import render_markdown, write_reports
from tasks.validate.stage import raise_if_failed, run_validation
from tests.helpers.datasets import make_dataset
from tests.helpers.params import project, validate_section
from tests.helpers.planted import EDITS, plant, real_images, sample_images
from tests.test_validate_overlay import write_test_overlay

DEFAULT = validate_section()
BASES = 20  # images planted with every edit
REASON = re.compile(r"^near-duplicate of train/n\d{8}/\S+\.JPEG \(distance \d+(, another class)?\)$")


# ---------------------------------------------------------------- the search, against brute force
def _random_hashes(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, n, dtype=np.uint64)


@pytest.mark.parametrize("distance", [0, 3, 6, 10, 16])
def test_banded_search_finds_exactly_the_brute_force_pairs(distance):
    rng = np.random.default_rng(distance)
    train, val = _random_hashes(rng, 2500), _random_hashes(rng, 400)
    for i in range(150):  # near copies at every distance 0..20
        flips = rng.choice(64, i % 21, replace=False)
        val[i] = train[7 * i] ^ np.uint64(sum(1 << int(b) for b in flips))
    train[11] = train[12] ^ np.uint64(1 << 40)  # a pair inside train
    brute = popcount(val[:, None] ^ train[None, :])
    found = near_pairs(val, train, distance)
    assert list(zip(found["query"], found["indexed"])) == list(zip(*np.nonzero(brute <= distance)))
    assert (found["distance"] == brute[found["query"], found["indexed"]]).all()
    inside = np.triu(popcount(train[:, None] ^ train[None, :]) <= distance, 1)
    self_found = near_pairs(train, train, distance, self_join=True)
    assert list(zip(self_found["query"], self_found["indexed"])) == list(zip(*np.nonzero(inside)))


def test_skewed_fingerprints_are_searched_in_bounded_pieces(monkeypatch):
    from tasks.validate import near_dup
    monkeypatch.setattr(near_dup, "CANDIDATE_BLOCK", 500)  # many pieces, single probes above the block alone
    rng = np.random.default_rng(5)
    train = np.concatenate([np.full(3000, 0xF0F0F0F0F0F0F0F0, dtype=np.uint64), _random_hashes(rng, 2000)])
    val = np.concatenate([np.full(40, 0xF0F0F0F0F0F0F0F1, dtype=np.uint64), _random_hashes(rng, 300)])
    found = near_pairs(val, train, 8)
    brute = popcount(val[:, None] ^ train[None, :]) <= 8
    assert len(found) >= 40 * 3000
    assert list(zip(found["query"], found["indexed"])) == list(zip(*np.nonzero(brute)))


def test_popcount_without_numpy2_matches(monkeypatch):
    from tasks.validate import near_dup
    values = _random_hashes(np.random.default_rng(9), 1000)
    expected = [bin(int(v)).count("1") for v in values]
    assert near_dup.popcount(values).tolist() == expected
    monkeypatch.delattr(np, "bitwise_count", raising=False)  # numpy 1.26 has none
    assert near_dup.popcount(values).tolist() == expected


@pytest.mark.parametrize("distance", range(0, 17))
def test_band_plan_guarantees_a_band_within_radius(distance):
    plan = band_plan(distance, 50_000, 1_281_167)
    assert sum(plan.widths) == 64 and max(plan.widths) <= 22
    assert len(plan.widths) * (plan.radius + 1) > distance  # pigeonhole: some band differs in <= radius bits


def test_fingerprint_is_64_bits_and_undecodable_bytes_are_bad_images():
    data = real_images(1)[0][1] if real_images(1) else sample_bytes()
    value = fingerprint(data)
    assert 0 <= value < 2**64 and bin(value).count("1") == 32  # median threshold: half the bits set
    assert value == 0x5FDBA03CD8C12C78 or not real_images(1)  # dct64-v2 of the first sample: the bits are the format
    assert bin(fingerprint(plant(data, "q50")) ^ value).count("1") <= DEFAULT.near_duplicates_distance
    assert fingerprint(data) == value  # deterministic
    with pytest.raises(BadImage, match="undecodable: fingerprint decode failed"):
        stored_fingerprint(data[:20] + b"\x00" * 200)


def test_every_bit_of_the_fingerprint_carries_information(request):
    """dct64-v2 leaves the DC term out: no bit is the same for every image (v1's top bit was always 1), and each
    fingerprint has exactly 32 bits set (above the median of the 64 coefficients)."""
    images = real_images(300) or sample_images(request.getfixturevalue("sample_release"), 100)
    hashes = np.array([fingerprint(data) for _, data in images], dtype=np.uint64)
    bits = (hashes[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    share = bits.mean(axis=0)
    assert share.min() > 0.25 and share.max() < 0.75, share  # every bit set for some images and clear for others
    assert set(popcount(hashes).tolist()) == {32}
    assert FINGERPRINT_ALGORITHM == "dct64-v2"


def sample_bytes() -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG")
    return buf.getvalue()


def test_real_distinct_samples_give_no_pair():
    images = real_images()
    if len(images) < 1000:
        pytest.skip("../shared/data/imagenet-samples is absent")
    hashes = np.array([fingerprint(data) for _, data in images], dtype=np.uint64)
    pairs = near_pairs(hashes, hashes, DEFAULT.near_duplicates_distance, self_join=True)
    assert pairs.empty, pairs.head()


# ---------------------------------------------------------------- planted near-duplicates, end to end
@pytest.fixture(scope="module")
def planted(tmp_path_factory, request):
    """A folder-mode tree: BASES train images; in val every EDIT of each (one of them under another class) and
    distinct images; run through extract, convert and validate (default params)."""
    root = tmp_path_factory.mktemp("planted")
    images = real_images(BASES + 10)
    if not images:  # without ../shared: the built-in sample's pictures
        images = sample_images(request.getfixturevalue("sample_release"), BASES + 10)
    bases, distinct = images[:BASES], images[BASES:]
    tree, expected, number = root / "tree", {}, 0
    other = next(w for w, _ in bases if w != bases[0][0])  # the class base 0's cross-class copy is filed under

    def put(split, wnid, name, data):
        (tree / split / wnid).mkdir(parents=True, exist_ok=True)
        (tree / split / wnid / name).write_bytes(data)

    for i, (wnid, data) in enumerate(bases):
        put("train", wnid, f"{wnid}_{i}.JPEG", data)
        for edit in EDITS:
            number += 1
            val_wnid = other if (i, edit) == (0, "q90") else wnid  # one copy across classes
            put("val", val_wnid, f"ILSVRC2012_val_{number:08d}.JPEG", plant(data, edit))
            expected[f"ILSVRC2012_val_{number:08d}.JPEG"] = (val_wnid, wnid, f"{wnid}_{i}.JPEG", edit)
    for k in range(max(len(distinct), BASES)):  # every class keeps a val image once its copies are excluded
        data = distinct[k % len(distinct)][1]
        unique = data[:2] + b"\xff\xfe\x00\x06" + k.to_bytes(4, "big") + data[2:]  # a COM segment: new bytes
        put("val", bases[k % BASES][0], f"ILSVRC2012_val_{900 + k:08d}.JPEG", unique)
    setup = project(root)
    where = setup.paths
    for split in extract.SPLITS:
        extract.scan_folder_split_to(split, tree, where["work"] / "extract", root=root)
    extract.finalize(where["work"] / "extract", where["manifests"], where["label_map"], mode="folder")
    run_local(job_from_params(setup.params.convert, where, root=root), progress=False)
    curate.write_overlays(curate.job_from_params(setup))  # no curation lines yet
    report = run_validation(where["parquet"], where["manifests"], where["label_map"], DEFAULT, where["overlay"])
    return report, expected, where


def _near(report):
    return next(c for c in report["checks"] if c["name"] == "near_duplicates")


def test_planted_near_duplicates_are_found_and_warned_naming_the_file(planted):
    report, expected, _ = planted
    pairs = report["near_duplicates"]["pairs"]
    found = {p["val_name"] for p in pairs if expected.get(p["val_name"], (0, 0, None))[2] == p["train_name"]}
    missed = sorted(expected[name][3] for name in set(expected) - found)
    assert len(found) / len(expected) >= 0.95, f"recall {len(found)}/{len(expected)}; missed edits {missed}"
    assert {p["val_name"] for p in pairs} <= set(expected)  # no distinct image paired
    check = _near(report)
    assert check["status"] == "warn" and check["failures"] == len(pairs)
    chance = report["near_duplicates"]["chance"]  # the chance level and the tolerance, stated with the pairs found
    assert chance["comparisons"] == report["splits"]["train"]["rows"] * report["splits"]["val"]["rows"]
    assert chance["tolerated"] == DEFAULT.near_duplicates_max_pairs and "expected by chance: " in check["message"]
    assert next(c for c in report["checks"] if c["name"] == "leakage")["status"] == "pass"  # sha256 sees none
    assert pairs[0]["cross_class"] and pairs[0]["val_name"] in check["message"]
    assert sum(p["cross_class"] for p in pairs) == 1
    markdown = render_markdown(report)
    assert "## Near-duplicates" in markdown and "**yes**" in markdown and pairs[0]["train_name"] in markdown


def test_planted_near_duplicates_fail_above_max_pairs(planted):
    _, _, where = planted
    strict = validate_section(near_duplicates_max_pairs=0)
    report = run_validation(where["parquet"], where["manifests"], where["label_map"], strict, where["overlay"])
    assert _near(report)["status"] == "fail"
    with pytest.raises(PipelineError, match=r"near_duplicates: .*tolerated: 0 = max\(params\.yaml validate\.near_duplicates_max_pairs 0, validate\.near_duplicates_chance_margin 20 x expected\)\) — e\.g\. val n\d{8}/ILSVRC2012_val_\d{8}\.JPEG"):
        raise_if_failed(report, where["reports"])


def test_exclude_list_is_the_curation_format_and_the_picture_shows_the_pairs(planted):
    report, expected, where = planted
    write_reports(report, where["reports"], where["metrics"] / "validate.json")
    written = write_near_duplicate_outputs(report, where["parquet"], where["reports"])
    assert [p.name for p in written] == [NEAR_DUPLICATES_PNG, EXCLUDE_CSV]
    text = (where["reports"] / EXCLUDE_CSV).read_text(encoding="utf-8")
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == EXCLUDE_HEADER == ["split", "wnid", "name", "reason"]
    body = rows[1:]
    assert body == sorted(body) and len({(r[1], r[2]) for r in body}) == len(body)
    assert {r[2] for r in body} == {p["val_name"] for p in report["near_duplicates"]["pairs"]}
    for split, wnid, name, reason in body:
        assert split == "val" and wnid == expected[name][0] and REASON.match(reason), reason
        assert (f"train/{expected[name][1]}/{expected[name][2]}" in reason) or "another class" in reason
    assert sum("another class" in r[3] for r in body) == 1
    again = write_near_duplicate_outputs(report, where["parquet"], where["reports"] / "again")
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in written]  # deterministic
    with Image.open(where["reports"] / NEAR_DUPLICATES_PNG) as image:
        assert image.height == 28 + min(60, len(report["near_duplicates"]["pairs"])) * 80


def test_shards_without_fingerprints_warn_not_checked(tmp_path):
    dataset = make_dataset(tmp_path)
    for split in dataset.rows:
        for row in dataset.rows[split]:
            row.pop("phash")
    dataset.schema_overrides = {s: _schema_without_phash(dataset, s) for s in dataset.rows}
    dataset.write()
    check, section = near_duplicate_check(dataset.parquet_dir, DEFAULT)
    assert check.status == "warn" and "re-run the convert stage" in check.message and not section["checked"]


def test_shards_of_another_fingerprint_algorithm_are_not_compared(tmp_path):
    dataset = make_dataset(tmp_path)
    dataset.schema_overrides = {s: _schema_with_algorithm(dataset, s, "dct64-v0") for s in dataset.rows}
    dataset.write()
    check, section = near_duplicate_check(dataset.parquet_dir, DEFAULT)
    assert check.status == "warn" and not section["checked"]
    assert check.message == (f"not checked: the shards' fingerprints are 'dct64-v0', these distances are calibrated "
                             f"for {FINGERPRINT_ALGORITHM!r}; re-run the convert stage")


def _schema_with_algorithm(dataset, split, algorithm):
    from imagenet_parquet.format import METADATA_KEY, shard_schema
    schema = shard_schema(dataset.label_map, {"policy": "passthrough"}, split)
    own = {**json.loads(schema.metadata[METADATA_KEY]), "fingerprint_algorithm": algorithm}
    return schema.with_metadata({**schema.metadata, METADATA_KEY: json.dumps(own, sort_keys=True)})


def test_fingerprint_off_computes_none_and_validate_says_near_duplicates_were_not_checked(
        sample_release, tmp_path, monkeypatch):
    """convert.fingerprint false: no fingerprint computed, `phash` null in every row (same schema: the reader and
    Hugging Face `datasets` load it), and validate's report, metrics and picture say the check did not run."""
    from imagenet_parquet import ParquetImageDataset
    from imagenet_parquet.format import own_metadata
    from tasks.convert import stage as convert_stage
    from tasks.validate.report import metrics
    from tests.helpers.datasets import make_job, sample_dataset

    def refuse(data):
        raise AssertionError("fingerprint computed with convert.fingerprint false")
    monkeypatch.setattr(convert_stage, "stored_fingerprint", refuse)
    sample_dataset(tmp_path, sample_release)
    job = make_job(tmp_path, fingerprint=False)
    run_local(job, progress=False)
    shards = sorted(job.parquet.rglob("*.parquet"))
    for shard in shards:
        table = pq.read_table(shard)
        own = own_metadata(table.schema.metadata)
        assert table.column("phash").null_count == len(table) > 0
        assert own["convert_params"]["fingerprint"] is False and own["fingerprint_algorithm"] is None
    write_test_overlay(job.parquet)
    report = run_validation(job.parquet, job.manifests, job.label_map, DEFAULT)
    check = _near(report)
    assert check["status"] == "warn" and check["message"].startswith("not checked: convert.fingerprint is false")
    assert not report["near_duplicates"]["checked"] and metrics(report)["near_duplicate_pairs"] is None
    assert "**Not checked**: convert.fingerprint is false" in render_markdown(report)
    written = write_near_duplicate_outputs(report, job.parquet, tmp_path / "reports")
    assert written[1].read_text(encoding="utf-8") == ",".join(EXCLUDE_HEADER) + "\n"
    train = ParquetImageDataset(job.parquet, "train", decode=False)
    assert len(train) == sum(pq.read_metadata(s).num_rows for s in shards if s.parent.name == "train")
    assert train[0][0][:2] == b"\xff\xd8"
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets
    hf = datasets.load_dataset("parquet", data_files=[str(s) for s in shards if s.parent.name == "val"],
                               split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert hf.features["phash"].dtype == "uint64" and set(hf["phash"]) == {None}


def _schema_without_phash(dataset, split):
    from imagenet_parquet.format import shard_schema
    schema = shard_schema(dataset.label_map, {"policy": "passthrough"}, split)
    return schema.remove(schema.get_field_index("phash"))


def test_the_exclude_list_applied_through_curation_gives_a_version_without_the_leak(planted, tmp_path):
    """Issue 15's loop closed with curation (issue 27: merge-on-read): the candidate list, copied unchanged into
    the curation exclude file, drops every paired val image in the curate stage's overlay — no shard rewritten —
    and the next validation finds no pair."""
    report, _, where = planted
    written = write_near_duplicate_outputs(report, where["parquet"], tmp_path / "reports")
    exclude = tmp_path / "exclude.csv"
    exclude.write_bytes(written[1].read_bytes())
    shards = {p: p.read_bytes() for p in sorted(where["parquet"].rglob("*.parquet"))}
    lines = curation_lines.read_curation(exclude, None)
    job = curate.CurateJob(where["parquet"], where["manifests"], where["label_map"], tmp_path / "overlay", lines)
    curate.write_overlays(job)
    paired = {p["val_name"] for p in report["near_duplicates"]["pairs"]}
    assert paired and {p: p.read_bytes() for p in shards} == shards
    val = {r["name"] for r in pq.read_table(where["manifests"] / "val.parquet", columns=["name"]).to_pylist()}
    assert paired <= val  # the manifests as extracted: the overlay excludes them
    again = run_validation(where["parquet"], where["manifests"], where["label_map"], DEFAULT, tmp_path / "overlay")
    assert _near(again)["status"] == "pass" and again["near_duplicates"]["pairs"] == []
    assert again["splits"]["val"]["excluded"] == len(paired) and again["status"] == "pass"
    assert again["curation"]["exclude"]["val"]["lines"] == len(paired)
