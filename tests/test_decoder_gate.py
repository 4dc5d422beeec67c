"""Issue 48 (and issue 49's 4:4:1 JPEG): only JPEGs a native decoder is known to handle reach TurboJPEG, simplejpeg or
a DCT scale (imagenet_parquet/markers.py); a lossless or 4:4:1 JPEG — which killed the process (heap corruption in
libjpeg-turbo's scaled decode) or raised simplejpeg's KeyError: 6 — takes Pillow's full decode with the same box,
through the crop callables, decode_image, a folder-mode convert and both readers; a bad image in a shard is one
error naming the shard and the row. The fuzz test over every decoder path is tests/test_decoder_fuzz.py."""
from __future__ import annotations

import io
import json
import sys
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from imagenet_parquet import EvalCrop, ParquetImageDataset, ParquetIterableDataset, TrainCrop, decode_image, markers
from imagenet_parquet import turbo
from imagenet_parquet.crops import crop_resized, eval_window
from imagenet_parquet.decode import Encoded, ImageDecodeError, have_simplejpeg
from tests.helpers import jpegs
from tests.helpers.datasets import write_shards

DECODERS = ["auto", "pillow",
            pytest.param("turbojpeg", marks=pytest.mark.skipif(not turbo.available(), reason="no TurboJPEG 3 library")),
            pytest.param("simplejpeg", marks=pytest.mark.skipif(not have_simplejpeg(), reason="no simplejpeg"))]
LOSSLESS = jpegs.lossless_jpeg(jpegs.smooth(500, 375, 12))  # libjpeg-turbo 3's cjpeg -lossless writes such files
SUBSAMPLED_441 = jpegs.dct_jpeg(jpegs.smooth(500, 375, 17), [(1, 4), (1, 1), (1, 1)])  # cjpeg -sample 1x4,1x1,1x1


def _reference_eval(data: bytes, resize: int, size: int) -> np.ndarray:
    """EvalCrop's window cut from Pillow's full decode and resized by Pillow (the path the gate sends them)."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    top, left, h, w = eval_window(image.height, image.width, resize, size)
    return np.asarray(image.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h)))


def test_every_real_sample_passes_the_gate_with_pillows_size(shared_data):
    """The hot path stays native: all 1,000 ImageNet samples (4:4:4, 4:2:0, 4:2:2, 4:4:0, grey) pass."""
    paths = sorted((shared_data / "imagenet-samples").glob("*.JPEG"))
    assert len(paths) == 1000
    for path in paths:
        data = path.read_bytes()
        assert markers.native_size(data) == Image.open(io.BytesIO(data)).size, (path.name, markers.read_frame(data))


@pytest.mark.parametrize("case", [c for c in jpegs.valid_cases() + jpegs.edited_cases() if c.native is not None],
                         ids=lambda c: c.name)
def test_the_gate_passes_exactly_the_jpegs_the_native_decoders_handle(case):
    frame = markers.read_frame(case.data)
    assert (markers.native_size(case.data) is not None) == case.native, None if frame is None else frame.problem
    if case.valid:  # whatever the verdict, the size is the frame's own
        assert frame is not None and (frame.width, frame.height) == case.size == Image.open(io.BytesIO(case.data)).size


def test_the_gate_says_why():
    assert markers.read_frame(LOSSLESS).problem == "lossless frame (SOF3)"
    assert markers.read_frame(SUBSAMPLED_441).problem == "3 components sampled 1x4,1x1,1x1"
    twelve = jpegs.dct_jpeg(jpegs.smooth(24, 16, 1, peak=4095), precision=12)
    assert markers.read_frame(twelve).problem == "12-bit samples"
    arithmetic = jpegs.replace_marker(jpegs.dct_jpeg(jpegs.smooth(24, 16, 2)), 0xC0, 0xC9)
    assert markers.read_frame(arithmetic).problem == "arithmetic extended frame (SOF9)"


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("name, data", [("lossless", LOSSLESS), ("4:4:1", SUBSAMPLED_441)])
def test_lossless_and_441_jpegs_take_pillows_full_decode_with_the_same_box(decoder, name, data):
    """Before the gate: a glibc abort or SIGSEGV (lossless, every decoder at a reduced scale), KeyError: 6
    (4:4:1, simplejpeg and "auto" without TurboJPEG)."""
    image = Encoded.parse(data, decoder)
    assert (image.backend, image.scalable, image.width, image.height) == ("pillow", False, 500, 375)
    for size, resize in [(224, 256), (32, 32), (8, 8)]:  # 1/1, and boxes that would decode at 1/8 if scalable
        out = EvalCrop(size, resize=resize, decoder=decoder)(data)
        assert out.shape == (3, size, size) and out.dtype == torch.uint8
        diff = np.abs(out.permute(1, 2, 0).numpy().astype(int) - _reference_eval(data, resize, size))
        assert diff.mean() <= 0.6, (name, size, diff.mean())  # torch's and Pillow's bilinear kernels round apart
    for seed in range(5):
        crop = TrainCrop(16, decoder=decoder, generator=torch.Generator().manual_seed(seed))
        assert crop(data).shape == (3, 16, 16)
    assert decode_image(data, draft_size=16).size == (500, 375)  # no draft: full size


def test_a_short_file_declaring_a_large_size_is_an_error_not_a_grey_picture():
    """2 KB of data for 20000x4000 pixels: Pillow returns 240 MB of grey without a word; the reader refuses it."""
    bomb = jpegs.with_size(jpegs.dct_jpeg(jpegs.smooth(48, 32, 3)), 20000, 4000)
    for decode in [decode_image, TrainCrop(224), EvalCrop(224)]:
        with pytest.raises(OSError, match=r"20000x4000 \(1,250,000 blocks of 8x8.* truncated, or a decompression bomb"):
            decode(bomb)


@pytest.mark.skipif(not turbo.available(), reason="no TurboJPEG 3 library")
def test_turbojpeg_never_reports_the_previous_images_header():
    """libjpeg-turbo 3.0's tj3DecompressHeader returns 0 for bytes it cannot parse and keeps the last image's
    header: turbo.header checks it against the frame header."""
    good = jpegs.pillow_jpeg(jpegs.smooth(64, 48, 4))
    assert turbo.header(good)[:2] == (64, 48)
    for bad in [b"\xff\xd8 not a jpeg", good[:30]]:
        with pytest.raises(turbo.TurboError, match="the frame says None"):
            turbo.header(bad)


def test_the_gpu_path_sends_only_the_jpegs_the_gate_passes_to_nvjpeg(monkeypatch):
    """GpuAugment.decode: nvJPEG (torchvision.io.decode_jpeg, faked here: no CUDA) gets the plain JPEG; the lossless
    and 4:4:1 ones are Pillow's, in their places."""
    from imagenet_parquet.gpu import GpuAugment

    seen: list[bytes] = []

    def decode_jpeg(data, mode, device):
        seen.extend(bytes(tensor.numpy()) for tensor in data)
        return [torch.from_numpy(np.asarray(decode_image(bytes(t.numpy())))).permute(2, 0, 1) for t in data]

    fake = types.ModuleType("torchvision.io")
    fake.ImageReadMode, fake.decode_jpeg = types.SimpleNamespace(RGB="RGB"), decode_jpeg
    monkeypatch.setitem(sys.modules, "torchvision.io", fake)
    plain = jpegs.pillow_jpeg(jpegs.smooth(64, 48, 7))
    out = GpuAugment(device="cpu").decode([LOSSLESS, plain, SUBSAMPLED_441])
    assert seen == [plain]
    assert [tuple(image.shape) for image in out] == [(3, 375, 500), (3, 48, 64), (3, 375, 500)]
    for image, data in zip(out, [LOSSLESS, plain, SUBSAMPLED_441]):
        assert torch.equal(image, torch.from_numpy(np.asarray(decode_image(data))).permute(2, 0, 1))
    assert GpuAugment(device="cpu").decode([LOSSLESS])[0].shape == (3, 375, 500)  # nothing for nvJPEG: no call
    assert seen == [plain]


def test_a_bad_image_in_a_shard_is_one_error_naming_the_shard_and_the_row(tmp_path):
    [path] = write_shards(tmp_path, total=6, shards=1)
    rows = pq.read_table(path).to_pylist()
    rows[2]["image"]["bytes"] = jpegs.pillow_jpeg(jpegs.smooth(300, 200, 5))[:3000]
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(path)), path, row_group_size=4)
    expected = rf"{path}: row 2: expected an image the decoders read, found bytes they refuse \(OSError: image file " \
               r"is truncated.*curation/exclude.csv"
    for dataset in [ParquetImageDataset(tmp_path, "train", overlay=False),
                    ParquetImageDataset(tmp_path, "train", crop=EvalCrop(16, resize=16), overlay=False)]:
        assert dataset[1][0] is not None
        with pytest.raises(ImageDecodeError, match=expected) as caught:
            dataset[2]
        assert isinstance(caught.value.__cause__, OSError)
    with pytest.raises(ImageDecodeError, match=expected):
        list(ParquetIterableDataset(tmp_path, "train", crop=TrainCrop(16), shuffle=False, overlay=False))


# ---------------------------------------------------------------- through convert and the readers


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    """A folder source holding the lossless and the 4:4:1 JPEG beside a plain one, through extract (folder mode),
    convert and curate as `dvc repro` runs them."""
    from tasks.convert.distribute import run_local
    from tasks.convert.job import job_from_params
    from tasks.curate import stage as curate
    from tasks.extract import stage as extract
    from tests.helpers.params import project

    base = tmp_path_factory.mktemp("gate")
    tree, root = base / "tree", base / "project"
    images = {"lossless.jpg": LOSSLESS, "subsampled_441.jpg": SUBSAMPLED_441,
              "plain.jpg": jpegs.pillow_jpeg(jpegs.smooth(320, 240, 6))}
    for split in ("train", "val"):
        for name, data in images.items():
            (tree / split / "cls" / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / split / "cls" / name).write_bytes(data)
    setup = project(root)
    where = setup.paths
    for split in ("train", "val"):
        extract.scan_folder_split_to(split, tree, where["work"] / "extract", root=root)
    extract.finalize(where["work"] / "extract", where["manifests"], where["label_map"], mode="folder")
    report = run_local(job_from_params(setup.params.convert, where, root=root), progress=False)
    assert report["bad_images"] == 0  # before: the lossless one quarantined (its fingerprint's scaled decode failed)
    curate.write_overlays(curate.job_from_params(setup))
    return where["parquet"], images


def test_convert_stores_the_lossless_and_441_jpegs_byte_for_byte_with_a_fingerprint(converted):
    parquet, images = converted
    table = pq.read_table(sorted((parquet / "train").glob("*.parquet")), columns=["image", "transform", "phash"])
    stored = {row["image"]["path"].rsplit("/", 1)[-1]: row for row in table.to_pylist()}
    assert set(stored) == set(images)
    for name, data in images.items():
        assert stored[name]["image"]["bytes"] == data and stored[name]["transform"] == "none"
        assert stored[name]["phash"] is not None


@pytest.mark.parametrize("decoder", DECODERS)
def test_every_reader_path_crops_the_lossless_and_441_jpegs(converted, decoder):
    from torch.utils.data import DataLoader

    parquet, images = converted
    by_size = {Image.open(io.BytesIO(data)).size: data for data in images.values()}
    assert len(by_size) == 2  # lossless and 4:4:1 share 500x375: which is which comes from the bytes
    maps = ParquetImageDataset(parquet, "val", crop=EvalCrop(224, resize=256, decoder=decoder), decode=True)
    raw = ParquetImageDataset(parquet, "val", decode=False)
    for i in range(len(maps)):
        image, _ = maps[i]
        data = raw[i][0]
        assert image.shape == (3, 224, 224)
        reference = _reference_eval(data, 256, 224)
        assert np.abs(image.permute(1, 2, 0).numpy().astype(int) - reference).mean() <= 0.6
    iterable = ParquetIterableDataset(parquet, "train", crop=TrainCrop(32, decoder=decoder), batch_size=3, seed=1)
    batches = list(DataLoader(iterable, batch_size=3, num_workers=2))
    assert sum(len(labels) for _, labels in batches) == 3 and all(x.shape[1:] == (3, 32, 32) for x, _ in batches)
    plain = ParquetImageDataset(parquet, "train", draft_size=16)
    assert sorted(plain[i][0].size for i in range(len(plain))) == [(40, 30), (500, 375), (500, 375)]  # 1/8, 1/1, 1/1


def test_the_crop_box_is_the_full_decodes_box(converted):
    """The same window of the same pixels whichever decoder the gate picks (here: Pillow's, at full scale)."""
    _, images = converted
    data = images["lossless.jpg"]
    image = Encoded.parse(data)
    window = eval_window(image.height, image.width, 256, 224)
    fast = crop_resized(image, window, 224)
    assert np.abs(fast.permute(1, 2, 0).numpy().astype(int) - _reference_eval(data, 256, 224)).mean() <= 0.6
    assert json.dumps(markers.read_frame(data).problem) == '"lossless frame (SOF3)"'
