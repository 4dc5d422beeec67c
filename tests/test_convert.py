"""convert stage, task level: encoding policy, bad images, determinism, resume after kill -9, HF datasets, DuckDB."""
from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageStat

from imagenet_parquet.format import TRANSFORM_PATTERN
from tasks.common import PipelineError
from tasks.convert.distribute import run_local
from tasks.convert.plan import order_hash, order_rows
from tasks.convert.stage import prepare
from tests.helpers.datasets import flat_dataset, make_job, read_rows, sample_dataset, shard_bytes
from tests.helpers.images import jpeg, noisy_jpeg
from tests.helpers.project import REPO


def _decode(data: bytes) -> Image.Image:
    im = Image.open(io.BytesIO(data))
    im.load()
    return im


def _mean(im: Image.Image) -> list[float]:
    return ImageStat.Stat(im).mean


def _close(rgb, expected, tol=12) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(rgb, expected))


def test_sample_passthrough_round_trip(sample_release, tmp_path):
    sample_dataset(tmp_path, sample_release)
    job = make_job(tmp_path)
    metrics = run_local(job, progress=False)
    manifests = {s: order_rows(pq.read_table(job.manifest(s)), job.order).to_pylist() for s in ("train", "val")}
    seen = set()
    for split, manifest in manifests.items():
        rows = read_rows(job, split)
        assert [r["image"]["path"] for r in rows] == [m["name"] for m in manifest]
        for row, entry in zip(rows, manifest):
            with open(entry["source"], "rb") as fh:
                fh.seek(entry["offset"])
                source = fh.read(entry["size"])
            found = Image.open(io.BytesIO(source))
            clean = found.format == "JPEG" and found.mode in ("RGB", "L")
            seen.add((found.format, found.mode, clean))
            assert (row["image"]["bytes"] == source) == clean, row["image"]["path"]
            assert row["transform"] == "none" if clean else row["transform"].endswith("reencode_q90")
            stored = _decode(row["image"]["bytes"])
            assert stored.format == "JPEG" and stored.mode in ("RGB", "L") and stored.size == found.size
            assert (row["width"], row["height"]) == stored.size and row["label"] == entry["label"]
        assert metrics["splits"][split]["rows"] == len(manifest)
    assert {("JPEG", "RGB", True), ("JPEG", "L", True), ("JPEG", "CMYK", False), ("PNG", "RGB", False)} <= seen
    train = read_rows(job, "train")
    assert sum(r["exif_orientation"] == 6 and r["transform"] == "none" for r in train) == 1
    assert metrics["bad_images"] == 0 and (job.parquet / "bad_images.jsonl").read_text() == ""


def test_conversions_are_rgb_jpegs_with_the_right_colours(tmp_path):
    colour = (200, 30, 40)
    images = {
        "cmyk.JPEG": jpeg(colour, mode="CMYK", quality=95), "png.JPEG": jpeg(colour, fmt="PNG"),
        "graypng.JPEG": jpeg((90, 90, 90), mode="L", fmt="PNG"), "palette.JPEG": jpeg(colour, mode="P", fmt="PNG"),
        "rgba.JPEG": jpeg(colour, mode="RGBA", fmt="PNG"), "gif.JPEG": jpeg(colour, mode="P", fmt="GIF"),
        "gray.JPEG": jpeg((90, 90, 90), mode="L", quality=95),
    }
    flat_dataset(tmp_path, [("n01", name, data) for name, data in images.items()])
    job = make_job(tmp_path)
    run_local(job, progress=False)
    rows = {r["image"]["path"]: r for r in read_rows(job)}
    expected = {"cmyk.JPEG": "cmyk_to_rgb+reencode_q90", "png.JPEG": "png_to_jpeg+reencode_q90",
                "graypng.JPEG": "png_to_jpeg+to_rgb+reencode_q90", "palette.JPEG": "png_to_jpeg+to_rgb+reencode_q90",
                "rgba.JPEG": "png_to_jpeg+to_rgb+reencode_q90", "gif.JPEG": "gif_to_jpeg+to_rgb+reencode_q90"}
    for name, transform in expected.items():
        stored = _decode(rows[name]["image"]["bytes"])
        assert (stored.format, stored.mode, rows[name]["transform"]) == ("JPEG", "RGB", transform), name
        want = _mean(_decode(images[name]).convert("RGB"))  # palette images: dithered palette entries
        assert _close(want, (90, 90, 90) if name == "graypng.JPEG" else colour, tol=25)
        assert _close(_mean(stored), want, tol=6), (name, _mean(stored), want)
    gray = rows["gray.JPEG"]
    assert gray["image"]["bytes"] == images["gray.JPEG"] and gray["transform"] == "none"
    assert _close(_decode(gray["image"]["bytes"]).convert("RGB").getpixel((5, 5)), (90, 90, 90))
    assert rows["png.JPEG"]["source_format"] == "PNG" and rows["cmyk.JPEG"]["source_format"] == "JPEG"
    assert all(re.match(TRANSFORM_PATTERN, r["transform"]) for r in rows.values())


def test_reencode_resize_and_exif_policies(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6
    rotated = jpeg(size=(400, 300), exif=exif.tobytes())
    small = jpeg(size=(100, 80))
    flat_dataset(tmp_path, [("n01", "rotated.JPEG", rotated), ("n01", "small.JPEG", small)])
    keep = make_job(tmp_path, resize_shorter=256, quality=80)
    run_local(keep, progress=False)
    rows = {r["image"]["path"]: r for r in read_rows(keep)}
    assert rows["small.JPEG"]["image"]["bytes"] == small  # never upscaled, still untouched
    assert (rows["rotated.JPEG"]["width"], rows["rotated.JPEG"]["height"]) == (341, 256)
    assert rows["rotated.JPEG"]["transform"] == "resize_256+reencode_q80"
    assert rows["rotated.JPEG"]["exif_orientation"] == 6
    transpose = make_job(tmp_path, policy="reencode", exif="transpose", quality=70)
    run_local(transpose, progress=False)
    rows = {r["image"]["path"]: r for r in read_rows(transpose)}
    assert rows["rotated.JPEG"]["transform"] == "exif_transpose+reencode_q70"
    assert _decode(rows["rotated.JPEG"]["image"]["bytes"]).size == (300, 400)
    assert rows["small.JPEG"]["transform"] == "reencode_q70" and rows["small.JPEG"]["image"]["bytes"] != small


def test_bad_images_are_quarantined_counted_and_can_fail_the_stage(tmp_path):
    good = [("n01", f"ok{i}.JPEG", noisy_jpeg(i)) for i in range(6)]
    bad = [("n02", "empty.JPEG", b""), ("n02", "truncated.JPEG", noisy_jpeg(9)[:-400]),
           ("n02", "text.JPEG", b"<html>not an image</html>"), ("n02", "bomb.JPEG", jpeg(size=(300, 300))),
           ("n02", "corrupt.PNG", jpeg(fmt="PNG")[:60])]
    flat_dataset(tmp_path, good + bad)
    job = make_job(tmp_path, max_image_pixels=50_000, max_bad_fraction=0.5)
    metrics = run_local(job, progress=False)
    assert metrics["rows"] == 6 and metrics["bad_images"] == 5
    records = [json.loads(line) for line in (job.parquet / "bad_images.jsonl").read_text().splitlines()]
    reasons = {r["name"]: r["reason"].split(":")[0] for r in records}
    assert reasons == {"empty.JPEG": "empty", "truncated.JPEG": "truncated", "text.JPEG": "not_an_image",
                       "bomb.JPEG": "decompression_bomb", "corrupt.PNG": "truncated"}
    assert all(r["source"] == "data/raw/train.tar" and r["member"] == r["name"] for r in records)
    assert " at 0x" not in (job.parquet / "bad_images.jsonl").read_text()  # no object addresses: deterministic
    assert {r["image"]["path"] for r in read_rows(job)} == {name for _, name, _ in good}
    strict = make_job(tmp_path, max_image_pixels=50_000, max_bad_fraction=0.1)
    with pytest.raises(PipelineError, match=r"max_bad_fraction=0.1.*found 5 of 11"):
        run_local(strict, progress=False)


def _dataset(root: Path) -> None:
    flat_dataset(root, [("n0%d" % (i % 3), f"img{i:03d}.JPEG", noisy_jpeg(i)) for i in range(40)]
                 + [("n01", "cmyk.JPEG", jpeg(mode="CMYK")), ("n02", "zero.JPEG", b"")])


def test_same_bytes_for_1_2_and_3_workers_and_stale_shards_removed(tmp_path):
    outputs = []
    for workers in (1, 2, 3):
        root = tmp_path / f"w{workers}"
        _dataset(root)
        job = make_job(root, shard_mb=0.06, row_group_rows=4)
        metrics = run_local(job, workers=workers, progress=False)
        outputs.append(shard_bytes(job))
    assert metrics["splits"]["train"]["shards"] > 3 and outputs[0] == outputs[1] == outputs[2]
    files = pq.ParquetFile(job.parquet / "train" / sorted(outputs[1])[1].split("/")[1])
    sizes = [files.metadata.row_group(i).num_rows for i in range(files.num_row_groups)]
    assert sizes[:-1] == [4] * (len(sizes) - 1) and 0 < sizes[-1] <= 4
    bigger = make_job(root, shard_mb=1, row_group_rows=4)
    run_local(bigger, progress=False)
    names = [f"img{i:03d}.JPEG" for i in range(40)] + ["cmyk.JPEG", "zero.JPEG"]
    first = min(names, key=order_hash)  # hashed order: the manifest row with the smallest hash leads
    assert [p.name for p in (root / "data/parquet/train").iterdir()] == [f"train-h{order_hash(first).hex()[:16]}.parquet"]


KILL_SCRIPT = """
import sys
sys.path.insert(0, {repo!r})
from tests.helpers.datasets import make_job
from tasks.convert.distribute import run_local
run_local(make_job(__import__("pathlib").Path({root!r}), shard_mb=0.01, row_group_rows=4, policy="reencode"),
          progress=False)
"""


def test_kill_9_then_rerun_resumes_to_identical_bytes(tmp_path):
    fresh, killed = tmp_path / "fresh", tmp_path / "killed"
    for root in (fresh, killed):
        _dataset(root)
    reference_job = make_job(fresh, shard_mb=0.01, row_group_rows=4, policy="reencode")
    run_local(reference_job, progress=False)
    reference = shard_bytes(reference_job)
    total = len(list((fresh / "data/parquet/train").glob("*.parquet")))
    stats_dir = killed / "data/scratch/convert/train"
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT.format(repo=str(REPO), root=str(killed))],
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while not (stats_dir.is_dir() and any(stats_dir.glob("*.json"))) and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = len(list(stats_dir.glob("*.json")))
    assert 1 <= finished < total, "the kill must land mid-run"
    job = make_job(killed, shard_mb=0.01, row_group_rows=4, policy="reencode")
    metrics = run_local(job, workers=2, progress=False)
    assert metrics["resumed_shards"] >= finished and shard_bytes(job) == reference
    first = sorted((killed / "data/parquet/train").glob("*.parquet"))[0]
    first.write_bytes(first.read_bytes()[:-10] + b"x" * 10)  # damaged: refused while the history lists it
    with pytest.raises(PipelineError, match="unreadable file"):
        run_local(job, progress=False)
    job.layout.unlink()  # without the history (`make relayout`), a damaged finished shard is redone
    assert run_local(job, progress=False)["resumed_shards"] == total - 1 and shard_bytes(job) == reference


def test_hugging_face_datasets_reads_image_and_class_label(tmp_path):
    datasets = pytest.importorskip("datasets")
    _dataset(tmp_path)
    job = make_job(tmp_path, shard_mb=0.06)
    run_local(job, progress=False)
    files = [str(p) for p in sorted((job.parquet / "train").glob("*.parquet"))]
    ds = datasets.Dataset.from_parquet(files, cache_dir=str(tmp_path / "hf"))
    assert isinstance(ds.features["image"], datasets.Image)
    assert ds.features["label"].names == ["class n00", "class n01", "class n02"]
    assert ds[0]["image"].size == (96, 72) and ds.features["label"].int2str(ds[0]["label"]) == ds[0]["label_name"]
    loaded = datasets.load_dataset("parquet", data_files={"train": files}, cache_dir=str(tmp_path / "hf2"))
    assert loaded["train"].features == ds.features and loaded["train"].num_rows == 41


def test_duckdb_counts_rows_per_label(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    _dataset(tmp_path)
    job = make_job(tmp_path, shard_mb=0.06)
    run_local(job, progress=False)
    glob = str(job.parquet / "train" / "*.parquet")
    counts = duckdb.sql(f"SELECT label, count(*) FROM read_parquet('{glob}') GROUP BY label ORDER BY label").fetchall()
    manifest = pq.read_table(job.manifest("train")).to_pylist()
    expected = {}
    for row in manifest:
        if row["name"] != "zero.JPEG":
            expected[row["label"]] = expected.get(row["label"], 0) + 1
    assert counts == sorted(expected.items())


def test_schema_metadata_and_writer_settings(tmp_path):
    _dataset(tmp_path)
    job = make_job(tmp_path, shard_mb=0.06, workers=7, task_runner="dask", dask_address="tcp://x:1")
    run_local(job, progress=False)
    shard = pq.ParquetFile(sorted((job.parquet / "train").glob("*.parquet"))[0])
    meta = json.loads(shard.schema_arrow.metadata[b"imagenet_parquet"])
    assert meta["split"] == "train" and meta["hash_algorithm"] == "sha256" and "workers" not in meta["convert_params"]
    assert meta["fingerprint_algorithm"] == "dct64-v2" and meta["convert_params"]["fingerprint"] is True
    assert meta["label_map"]["num_classes"] == 3
    columns = shard.metadata.row_group(0)
    compression = {columns.column(i).path_in_schema: columns.column(i).compression for i in range(columns.num_columns)}
    assert compression["image.bytes"] == "UNCOMPRESSED" and compression["sha256"] == "ZSTD"
    assert shard.schema_arrow.names == ["image", "label", "wnid", "label_name", "width", "height", "source_format",
                                        "transform", "exif_orientation", "sha256", "phash"]


@pytest.mark.parametrize("key,value", [("policy", "fast"), ("quality", 0), ("exif", "rotate"), ("shard_mb", 0),
                                       ("row_group_rows", 1.5), ("max_bad_fraction", 2)])
def test_bad_params_name_the_key(key, value, tmp_path):
    with pytest.raises(PipelineError, match=f"convert.{key}: expected"):
        make_job(tmp_path, **{key: value})


def test_missing_inputs_fail_clearly(tmp_path):
    flat_dataset(tmp_path, [("n01", "a.JPEG", noisy_jpeg(1))])
    (tmp_path / "data/raw/train.tar").unlink()
    with pytest.raises(PipelineError, match="data/raw/train.tar: expected the file named by the manifest"):
        run_local(make_job(tmp_path), progress=False)
    (tmp_path / "data/manifests/train.parquet").unlink()
    with pytest.raises(PipelineError, match="found none; run the extract stage"):
        prepare(make_job(tmp_path))


def test_an_archive_cut_short_after_extract_fails_clearly_and_leaves_no_shard(tmp_path):
    """The manifest's (offset, size) past the end of a replaced, shorter archive: one error naming the archive, the
    offset and what to rerun; no shard under a final name, nothing half-written beside it."""
    images = [(f"n0{i % 2}", f"img_{i:02d}.JPEG", noisy_jpeg(i)) for i in range(6)]
    tar = flat_dataset(tmp_path, images)
    tar.write_bytes(tar.read_bytes()[: tar.stat().st_size // 2])
    job = make_job(tmp_path, workers=1)
    with pytest.raises(PipelineError, match=r"data/raw/train.tar: expected \d+ bytes at offset \d+ \(from the "
                       r"manifest\), found \d+; the archive changed after extraction"):
        run_local(job, progress=False)
    assert sorted(p.name for p in (job.parquet / "train").glob("*")) == []

def test_row_groups_are_cut_early_when_their_images_are_large(tmp_path, monkeypatch):
    import imagenet_parquet.writer

    _dataset(tmp_path)
    job = make_job(tmp_path, row_group_rows=100)
    run_local(job, progress=False)
    whole = read_rows(job)
    monkeypatch.setattr(imagenet_parquet.writer, "ROW_GROUP_MAX_BYTES", 20_000)
    job = make_job(tmp_path, row_group_rows=99)  # another plan key: the shard is rewritten
    run_local(job, progress=False)
    shard = pq.ParquetFile(next((job.parquet / "train").glob("*.parquet")))
    groups = [shard.read_row_group(i).column("image").to_pylist() for i in range(shard.num_row_groups)]
    assert len(groups) > 5 and all(sum(len(r["bytes"]) for r in g[:-1]) < 20_000 for g in groups)
    assert read_rows(job) == whole


def test_plan_cuts_by_target_bytes_from_sizes_alone():
    from tasks.convert.plan import plan_ranges

    assert plan_ranges([10] * 10, 30) == [(0, 3, 30), (3, 5, 20), (5, 8, 30), (8, 10, 20)]  # balanced, not 30+30+30+10
    assert plan_ranges([5, 5, 5, 20, 1], 10) == [(0, 2, 10), (2, 4, 25), (4, 5, 1)]  # a big row may overfill one
    assert plan_ranges([7], 10) == [(0, 1, 7)]
    assert plan_ranges([], 10) == [(0, 0, 0)]  # an empty split still gets one (empty) shard with the schema
