"""convert.max_side: a bounded-side training copy (longer side <= max_side, aspect kept, never upscaled), its
composition with resize_shorter, its transform step, its place in the shards' identity, and its params rules."""
from __future__ import annotations

import io
import re

import pyarrow.parquet as pq
import pytest
from PIL import Image

from imagenet_parquet.format import TRANSFORM_PATTERN, own_metadata
from tasks.common import PipelineError
from tasks.convert.distribute import run_local
from tasks.convert.imaging import Policy, encode_image
from tasks.deploy.run_form import RunParams, apply_params, params_updates
from tests.helpers.datasets import flat_dataset, make_job, read_rows, shard_bytes
from tests.helpers.images import jpeg, noisy_jpeg
from tests.helpers.project import REPO, SHARED

BOUND = 320
SAMPLES = SHARED / "imagenet-samples"


def _size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        return im.size


def _synthetic() -> dict[str, bytes]:
    return {
        "wide.JPEG": noisy_jpeg(1, size=(640, 480)),  # -> 320x240
        "tall.JPEG": noisy_jpeg(2, size=(300, 900)),  # -> 107x320 (106.67 rounded)
        "at_bound.JPEG": noisy_jpeg(3, size=(320, 200)),  # within the bound: byte for byte
        "small.JPEG": noisy_jpeg(4, size=(100, 80)),
        "sliver.JPEG": jpeg(size=(1000, 10)),  # -> 320x3
        "gray.JPEG": jpeg((90, 90, 90), size=(500, 375), mode="L"),
        "big.PNG": jpeg(size=(400, 400), fmt="PNG"),  # converted anyway; bounded too
        "cmyk.JPEG": jpeg(size=(480, 360), mode="CMYK"),
    }


def _real() -> dict[str, bytes]:
    """A dozen real ImageNet JPEGs when the shared samples exist: the first 9 by name and 3 already within bound."""
    files = sorted(SAMPLES.glob("*.JPEG")) if SAMPLES.is_dir() else []
    small = [f for f in files if max(Image.open(f).size) <= BOUND][:3]
    return {f"real_{f.name}": f.read_bytes() for f in files[:9] + small}


EXPECTED = {
    "wide.JPEG": "max_side_320+reencode_q90",
    "tall.JPEG": "max_side_320+reencode_q90",
    "at_bound.JPEG": "none",
    "small.JPEG": "none",
    "sliver.JPEG": "max_side_320+reencode_q90",
    "gray.JPEG": "to_rgb+max_side_320+reencode_q90",
    "big.PNG": "png_to_jpeg+max_side_320+reencode_q90",
    "cmyk.JPEG": "cmyk_to_rgb+max_side_320+reencode_q90",
}


def test_max_side_bounds_the_longer_side_keeps_aspect_and_small_images(tmp_path):
    images = {**_synthetic(), **_real()}
    flat_dataset(tmp_path, [("n01", name, data) for name, data in images.items()])
    job = make_job(tmp_path, max_side=BOUND)
    assert run_local(job, progress=False)["rows"] == len(images)
    rows = {r["image"]["path"]: r for r in read_rows(job)}
    assert set(rows) == set(images)
    for name, row in rows.items():
        source, stored = _size(images[name]), _size(row["image"]["bytes"])
        assert (row["width"], row["height"]) == stored and max(stored) <= BOUND, name
        assert re.match(TRANSFORM_PATTERN, row["transform"]), row["transform"]
        if max(source) <= BOUND and name.endswith(".JPEG") and "gray" not in name and "cmyk" not in name:
            assert row["image"]["bytes"] == images[name] and row["transform"] == "none", name
            continue
        assert f"max_side_{BOUND}" in row["transform"] and max(stored) == BOUND, name
        (long_in, short_in), short_out = sorted(source, reverse=True), min(stored)
        assert abs(short_out - short_in * BOUND / long_in) <= 1, (name, source, stored)  # aspect kept
        assert (stored[0] >= stored[1]) == (source[0] >= source[1]), name  # orientation kept
    assert {name: rows[name]["transform"] for name in EXPECTED} == EXPECTED
    real = [name for name in rows if name.startswith("real_")]
    assert not SAMPLES.is_dir() or sum(rows[n]["transform"] == "none" for n in real) >= 3


@pytest.mark.parametrize("size, expected_size, step", [
    ((640, 480), (320, 240), "max_side_320"),  # shorter -> 256 would leave 341 > 320: max_side is tighter
    ((1000, 900), (284, 256), "resize_256"),  # max_side alone would leave 288 > 256: resize_shorter is tighter
    ((400, 200), (320, 160), "max_side_320"),  # shorter side already within 256
    ((300, 280), (274, 256), "resize_256"),  # longer side already within 320
    ((240, 320), None, None),  # within both: untouched
])
def test_with_resize_shorter_the_tighter_bound_applies_once(size, expected_size, step):
    data = noisy_jpeg(7, size=size)
    enc = encode_image(data, Policy(resize_shorter=256, max_side=320))
    if step is None:
        assert enc.data == data and enc.transform == "none"
        return
    assert enc.transform == f"{step}+reencode_q90" and (enc.width, enc.height) == expected_size == _size(enc.data)
    assert min(expected_size) <= 256 and max(expected_size) <= 320  # both bounds hold


def test_a_tie_is_named_resize_and_exif_rotated_images_bound_the_same_side():
    tie = encode_image(noisy_jpeg(8, size=(640, 480)), Policy(resize_shorter=240, max_side=320))
    assert tie.transform == "resize_240+reencode_q90" and (tie.width, tie.height) == (320, 240)
    exif = Image.Exif()
    exif[0x0112] = 6
    rotated = jpeg(size=(640, 480), exif=exif.tobytes())
    turned = encode_image(rotated, Policy(max_side=320, exif="transpose"))
    assert turned.transform == "exif_transpose+max_side_320+reencode_q90"
    assert (turned.width, turned.height) == (240, 320)
    kept = encode_image(rotated, Policy(max_side=320))
    assert kept.transform == "max_side_320+reencode_q90" and (kept.width, kept.height) == (320, 240)
    assert kept.exif_orientation == 6


def test_max_side_is_deterministic_and_part_of_the_shards_identity(tmp_path):
    images = [(f"n0{i % 2}", f"img{i:02d}.JPEG", noisy_jpeg(i, size=(400 + 8 * i, 300))) for i in range(8)]
    outputs = []
    for run in ("a", "b"):
        flat_dataset(tmp_path / run, images)
        job = make_job(tmp_path / run, max_side=BOUND, shard_mb=0.3, row_group_rows=3)
        run_local(job, progress=False)
        outputs.append(shard_bytes(job))
    assert outputs[0] == outputs[1] and len(outputs[0]) > 1
    shard = sorted((job.parquet / "train").glob("*.parquet"))[0]
    assert own_metadata(pq.read_schema(shard).metadata)["convert_params"]["max_side"] == BOUND
    other = make_job(tmp_path / "b", max_side=400, shard_mb=0.3, row_group_rows=3)
    assert run_local(other, progress=False)["resumed_shards"] == 0  # a new bound redoes every shard
    assert {r["transform"] for r in read_rows(other)} == {"none", "max_side_400+reencode_q90"}
    unbounded = make_job(tmp_path / "b", shard_mb=0.3, row_group_rows=3)
    assert "max_side" not in unbounded.output_params()  # absent = no bound: shards of older converts keep their keys
    assert run_local(unbounded, progress=False)["resumed_shards"] == 0
    assert {r["transform"] for r in read_rows(unbounded)} == {"none"}


@pytest.mark.parametrize("value", [0, -5, 65537, 2.5, "320", True])
def test_a_bad_max_side_is_one_params_error_naming_the_key(tmp_path, value):
    with pytest.raises(PipelineError) as err:
        make_job(tmp_path, max_side=value)
    problems = [line for line in str(err.value).splitlines() if line.startswith("  - ")]
    assert problems == [f"  - convert.max_side: expected an integer in [1, 65536] or null, found {value!r}"]


def test_the_run_form_sets_max_side_in_params_yaml(tmp_path):
    params_file = tmp_path / "params.yaml"
    params_file.write_text((REPO / "params.yaml").read_text())
    assert apply_params(params_file, params_updates(RunParams())) == {}
    assert apply_params(params_file, params_updates(RunParams(max_side=320))) == {"convert.max_side": (None, 320)}
    assert "  max_side: 320 " in params_file.read_text()
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        RunParams(max_side=0)
