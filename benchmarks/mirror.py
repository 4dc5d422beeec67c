"""Perceptually distinct variants of a folder of real JPEGs, for the ILSVRC2012-shaped mirror of bench_pipeline.py,
and the check that measures how near the mirror's images are to each other.

The sample (`tasks.acquire.sample.write_sample`) cycles the sorted JPEGs of a folder; round k of a source file (how
many times it has come round) becomes variant k: round 0 is the file's own bytes, round k >= 1 the picture rolled
(circular shift) by one of WINDOWS, then inverted or not, then flipped by one of FLIPS, re-encoded with the source's
own quantisation tables, chroma subsampling and ICC profile (sizes stay those of the source: +6 % per re-encoded
variant, the roll's seams; a 4,000-image mirror 441 MB against 422 MB before). Each variant also gets a unique JPEG
COM segment right after SOI (unique bytes: exact-duplicate leakage stays 0). Rolls by half a side (the fifth window:
a third) and the four flips x inversion move the 64-bit phash (tasks/convert/fingerprint.py) by >= 10 bits between
any two of the first ROUNDS variants of a source (measured on all 1000 sources x 40 rounds: 780,000 pairs, median
32, none within 8, one at 10 and 5 within 12, all of one picture, 24 within 14), beyond
validate.near_duplicates_distance (8); crops resized back and transposes (90-degree turns) were measured too and
come closer (min 2 and 10 on 200 sources, against 14 for these). Chance pairs between different sources remain: none
within 8 bits at 4,000 images, 10 (of all 8e8 pairs) at 40,000, so validate's default near_duplicates_max_pairs
(1000) holds. Past ROUNDS rounds the further windows (thirds of a side) come closer (min 6 measured) and past
len(WINDOWS) * 8 rounds the pixels repeat.

Variants are encoded in a process pool (default 2 workers) a little ahead of the archive writer, in order: same
folder and image count => byte-identical archives. `check_mirror` fingerprints every image of a built mirror
(`python -m benchmarks.bench_pipeline --check-mirror`)."""

from __future__ import annotations

import collections
import contextlib
import io
import multiprocessing
import tarfile
from collections.abc import Iterator
from multiprocessing.pool import AsyncResult, Pool
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageChops, JpegImagePlugin

from benchmarks.common import md_table, unique_jpeg
from tasks.acquire import sample
from tasks.common import ARCHIVES
from tasks.convert.fingerprint import fingerprint
from tasks.validate.near_dup import near_pairs, popcount

VERSION = 2  # in the mirror's directory name: a mirror kept from an older scheme is never reused
_T = Image.Transpose
FLIPS = (None, _T.FLIP_LEFT_RIGHT, _T.FLIP_TOP_BOTTOM, _T.ROTATE_180)
WINDOWS = (
    (0, 0),
    (1 / 2, 0),
    (0, 1 / 2),
    (1 / 2, 1 / 2),
    (1 / 3, 1 / 3),
    (2 / 3, 2 / 3),
    (1 / 3, 2 / 3),
    (2 / 3, 1 / 3),
    (1 / 3, 0),
    (2 / 3, 0),
    (0, 1 / 3),
    (0, 2 / 3),
)  # roll offsets (x, y), fractions of a side
ROUNDS = 5 * len(FLIPS) * 2  # variants per source measured >= 10 bits apart (the first five windows)
COM_TEXT = "imagenet-parquet bench_pipeline v{version} variant {serial}: round {round} of {name}"
LOOKAHEAD = 64  # variants encoded ahead of the archive writer
SOI_COM = b"\xff\xd8\xff\xfe"


def transform(k: int) -> tuple[tuple[float, float], bool, Image.Transpose | None]:
    """Variant k's (roll offsets, inverted, flip); k = 0 is the source itself."""
    k %= len(WINDOWS) * len(FLIPS) * 2
    return WINDOWS[k // (2 * len(FLIPS))], bool(k // len(FLIPS) % 2), FLIPS[k % len(FLIPS)]


def reencoded(data: bytes, k: int) -> bytes:
    """Variant k >= 1 of one JPEG's bytes, re-encoded like the source (quantisation tables, subsampling, ICC)."""
    (fx, fy), inverted, flip = transform(k)
    with Image.open(io.BytesIO(data)) as src:
        assert isinstance(src, JpegImagePlugin.JpegImageFile), "a JPEG source"
        settings = {
            "qtables": src.quantization,
            "subsampling": JpegImagePlugin.get_sampling(src),
            "icc_profile": src.info.get("icc_profile"),
        }
        image = ImageChops.offset(src, round(src.width * fx), round(src.height * fy))  # wraps round
    if inverted:
        image = ImageChops.invert(image)
    if flip is not None:
        image = image.transpose(flip)
    out = io.BytesIO()
    image.save(out, "JPEG", **settings)
    return out.getvalue()


def variant(path: Path, k: int, serial: int) -> bytes:
    """Round k of the JPEG at path (k = 0: its own bytes), with a unique COM segment (serial) after SOI."""
    data = path.read_bytes()
    if k:
        data = reencoded(data, k)
    return unique_jpeg(data, COM_TEXT.format(version=VERSION, serial=serial, round=k, name=path.name))


class VariantImages(sample.ImageSource):
    """The sample's real-image source (sorted JPEGs, cycled), each round of a file a distinct variant, encoded
    in `pool` (set by `variant_images`) LOOKAHEAD images ahead; quirk images are drawn as the sample draws them."""

    pool: Pool | None = None

    def __init__(self, rng: np.random.Generator, real_images: Path | None) -> None:
        super().__init__(rng, real_images)
        assert real_images is not None and self.pool is not None, "use variant_images() with real images"
        self.files = sorted(p for p in Path(real_images).iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
        self.served = 0
        self.ahead: collections.deque[AsyncResult[bytes]] = collections.deque()

    def next(self, quirk: str | None, label: int) -> bytes:
        if quirk is not None:
            return super().next(quirk, label)
        assert self.pool is not None
        while len(self.ahead) < LOOKAHEAD:
            n = self.served + len(self.ahead)
            path, k = self.files[n % len(self.files)], n // len(self.files)
            self.ahead.append(self.pool.apply_async(variant, (path, k, n + 1)))
        self.served += 1
        return self.ahead.popleft().get()


@contextlib.contextmanager
def variant_images(workers: int = 2) -> Iterator[type[VariantImages]]:
    """Within: `write_sample(real_images=..., image_source=<the class yielded>)` writes VariantImages, encoded by
    `workers` processes."""
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        VariantImages.pool = pool
        try:
            yield VariantImages
        finally:
            VariantImages.pool = None


# ---------------------------------------------------------------- the check
def mirror_images(mirror: Path) -> Iterator[tuple[str, Path, int, int]]:
    """(split, archive, offset, size) of every image of a mirror in archive order: train (class tars in order),
    then val."""
    train = mirror / ARCHIVES["train"]
    with tarfile.open(train) as outer:
        for member in outer:
            with tarfile.open(fileobj=outer.extractfile(member)) as inner:
                for image in inner:
                    yield "train", train, member.offset_data + image.offset_data, image.size
    with tarfile.open(mirror / ARCHIVES["val"]) as val:
        for image in val:
            yield "val", mirror / ARCHIVES["val"], image.offset_data, image.size


def _print_of(item: tuple[str, Path, int, int]) -> tuple[str, bool, int]:
    split, archive, offset, size = item
    with open(archive, "rb") as f:
        f.seek(offset)
        data = f.read(size)
    return split, data.startswith(SOI_COM), fingerprint(data)


def check_mirror(mirror: Path, sources: int, workers: int = 2) -> dict[str, Any]:
    """Fingerprint every image of `mirror` (built from `sources` real JPEGs) and count what validate would see:
    pairs within 8 bits over train + val, pairs within 4 inside train, and the distances between variants of
    one source (the images with a COM segment after SOI, the n-th of them from source n % sources)."""
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        rows = pool.map(_print_of, mirror_images(mirror), chunksize=64)
    prints = np.array([fp for _, _, fp in rows], dtype=np.uint64)
    train = prints[[split == "train" for split, _, _ in rows]]
    real = prints[[is_real for _, is_real, _ in rows]]
    same: list[np.ndarray] = []
    for source in range(min(sources, len(real))):
        group = real[source::sources]
        upper = np.triu_indices(len(group), 1)
        same.append(popcount(group[upper[0]] ^ group[upper[1]]))
    within = np.concatenate(same) if same else np.zeros(0, dtype=np.uint64)
    return {
        "images": len(prints),
        "train": len(train),
        "pairs_le_8": len(near_pairs(prints, prints, 8, True)),
        "train_pairs_le_4": len(near_pairs(train, train, 4, True)),
        "same_source_pairs": len(within),
        "same_source_min": int(within.min()) if len(within) else None,
        "same_source_median": float(np.median(within)) if len(within) else None,
        "same_source_le_8": int((within <= 8).sum()),
    }


def check_table(label: str, found: dict[str, Any]) -> str:
    """check_mirror's figures as a markdown table."""
    rows = [
        ("images (train)", f"{found['images']:,} ({found['train']:,})"),
        ("pairs within 8 bits, train + val", f"{found['pairs_le_8']:,}"),
        ("pairs within 4 bits, inside train", f"{found['train_pairs_le_4']:,}"),
        ("variant pairs of one source", f"{found['same_source_pairs']:,}"),
        ("... min / median distance", f"{found['same_source_min']} / {found['same_source_median']}"),
        ("... within 8 bits", f"{found['same_source_le_8']:,}"),
    ]
    return f"\n### {label}\n\n" + md_table(["figure", "value"], rows)
