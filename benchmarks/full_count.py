"""ILSVRC2012-shaped archives at ImageNet-1k's real count, for the full-count rehearsal (bench_full_count.py).

`build(out, train_total, val_total)` writes ILSVRC2012_img_train.tar (1,000 per-class tars, 732..1,300 images per
class summing exactly to `train_total`: benchmarks/bench_order.imagenet_counts), ILSVRC2012_img_val.tar (the first
`val_total` images of the real val labels, ../shared/data/imagenet/val_ground_truth.csv, under their real names),
the devkit (meta.mat with the sample's shuffled ILSVRC2012_ID order, the val ground truth as those IDs) and
`sample_md5.tsv`, from the 1,000 real sample JPEGs (one per class). A smaller `train_total` scales every class
(at least one image each): the same shape, for the linear-scaling run beside the full one.

Each image is small (shorter side 64..96 px, a few KB) and distinct: a 2 x 2 mosaic of crops of four source
pictures (the first its own class's, three drawn at random), each crop a random box of its source in one of the
eight dihedral orientations, the whole slightly rotated and tinted, JPEG quality 70..92, and a COM segment naming
its serial (unique bytes: exact leakage 0). Four independent quadrants keep the 64-bit phash of two images far
apart (a single source's crops alone would cluster within validate's 8 bits). `PLANTED` val images are a train
image of their own class re-encoded (quality 60, a faint tint): the near-duplicates validate must find. A few
quirk images (CMYK, grayscale, PNG bytes, EXIF-rotated) are drawn as the built-in sample draws them.

Images are made in a fork pool (one class tar / one block of val images per task, in order): same arguments =>
byte-identical archives."""

from __future__ import annotations

import csv
import functools
import io
import multiprocessing
import os
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.bench_order import imagenet_counts
from benchmarks.common import SAMPLES, unique_jpeg
from tasks.acquire import sample
from tasks.acquire.md5state import compute_md5
from tasks.common import ARCHIVES, write_text
from tasks.common.synsets import load_synsets

TRAIN_IMAGES, VAL_IMAGES = 1_281_167, 50_000
VAL_TRUTH = SAMPLES.parent / "imagenet" / "val_ground_truth.csv"
BASE_SHORT = 128  # sources are held decoded at this shorter side
PLANTED = 24  # val images that are re-encoded copies of a train image (near-duplicates by design)
VAL_BLOCK = 1000  # val images per pool task
COM = "imagenet-parquet full-count rehearsal image {serial}"
_T = Image.Transpose
DIHEDRAL = (None, _T.FLIP_LEFT_RIGHT, _T.FLIP_TOP_BOTTOM, _T.ROTATE_90, _T.ROTATE_180, _T.ROTATE_270, _T.TRANSPOSE)


@functools.cache
def sources() -> tuple[Image.Image, ...]:
    """The 1,000 sample JPEGs (sorted by name: the sample is one per class, named by wnid), RGB, shorter side
    BASE_SHORT."""
    out = []
    for path in sorted(p for p in SAMPLES.iterdir() if p.suffix.lower() in (".jpeg", ".jpg")):
        with Image.open(path) as src:
            src.draft("RGB", (BASE_SHORT, BASE_SHORT))
            rgb = src.convert("RGB")
        scale = BASE_SHORT / min(rgb.size)
        out.append(rgb.resize((max(1, round(rgb.width * scale)), max(1, round(rgb.height * scale)))))
    return tuple(out)


def _tile(rng: np.random.Generator, source: Image.Image, size: tuple[int, int]) -> Image.Image:
    w, h = source.size
    cw, ch = int(rng.integers(w // 3, w + 1)), int(rng.integers(h // 3, h + 1))
    left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    flip = DIHEDRAL[int(rng.integers(len(DIHEDRAL)))]
    tile = source.crop((left, top, left + cw, top + ch))
    tile = tile if flip is None else tile.transpose(flip)
    return tile.resize(size, Image.Resampling.BILINEAR)


def picture(serial: int, label: int) -> Image.Image:
    """Image `serial` (global, train then val) of class `label`: the mosaic, rotated and tinted."""
    rng = np.random.default_rng([7, serial])
    pool = sources()
    short = int(rng.integers(64, 97))
    aspect = (1.0, 4 / 3, 3 / 2, 3 / 4)[int(rng.integers(4))]
    w, h = (round(short * aspect), short) if aspect >= 1 else (short, round(short / aspect))
    canvas = Image.new("RGB", (w, h))
    picks = [label % len(pool), *rng.integers(0, len(pool), 3).tolist()]
    order = rng.permutation(4)
    half = (w // 2, h // 2)
    for quadrant, pick in zip(order.tolist(), picks, strict=True):
        box = ((quadrant % 2) * half[0], (quadrant // 2) * half[1])
        size = (w - half[0] if quadrant % 2 else half[0], h - half[1] if quadrant // 2 else half[1])
        canvas.paste(_tile(rng, pool[pick], size), box)
    canvas = canvas.rotate(float(rng.uniform(-12, 12)), Image.Resampling.BILINEAR, fillcolor=(127, 127, 127))
    gains = rng.uniform(0.8, 1.2, 3)
    lut = [min(255, int(v * g)) for g in gains for v in range(256)]
    return canvas.point(lut)


def encoded(image: Image.Image, serial: int, quality: int, quirk: str | None) -> bytes:
    if quirk is not None:
        return sample._encode(image, quirk)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return unique_jpeg(out.getvalue(), COM.format(serial=serial))


def _quality(serial: int) -> int:
    return int(np.random.default_rng([8, serial]).integers(70, 93))


def class_tar(job: tuple[int, str, int, int, dict[int, str]]) -> bytes:
    """One class's inner tar: `count` images from serial `first` on, named like ILSVRC2012's (wnid_number)."""
    label, wnid, first, count, quirks = job
    numbers = np.sort(np.random.default_rng([9, label]).choice(50_000, size=count, replace=False) + 1)
    members: list[tuple[str, bytes | None]] = []
    for k, number in enumerate(numbers.tolist()):
        serial = first + k
        data = encoded(picture(serial, label), serial, _quality(serial), quirks.get(serial))
        members.append((f"{wnid}_{number}.JPEG", data))
    return sample._tar_bytes(members)


def val_block(job: tuple[int, list[tuple[str, int]], int, dict[int, int], dict[int, int]]) -> list[tuple[str, bytes]]:
    """Val images [start, start + len(rows)): (real name, label) rows; `planted`: val index -> train serial it
    copies; `quirks`: val index -> quirk number."""
    start, rows, serial0, planted, quirks = job
    out = []
    for k, (name, label) in enumerate(rows):
        index = start + k
        if index in planted:
            copy = picture(planted[index], label)
            data = encoded(copy.point(lambda v: min(255, v + 3)), serial0 + index, 60, None)
        else:
            quirk = sample.VAL_QUIRKS[quirks[index]] if index in quirks else None
            data = encoded(picture(serial0 + index, label), serial0 + index, _quality(serial0 + index), quirk)
        out.append((name, data))
    return out


def class_counts(train_total: int) -> list[int]:
    """ImageNet-1k's 732..1,300 per class (sum 1,281,167); a smaller total scales each class (>= 1 image)."""
    counts = imagenet_counts()
    order = np.random.default_rng(11).permutation(len(counts))  # which classes are the short ones
    counts = counts[order]
    if train_total == TRAIN_IMAGES:
        return [int(c) for c in counts]
    return [max(1, round(int(c) * train_total / TRAIN_IMAGES)) for c in counts]


def val_rows(val_total: int, wnids: list[str]) -> list[tuple[str, int]]:
    """(name, label) of the val images: the real 50,000 in order; fewer: the first val_total // 1000 of each
    class in file order, renumbered 1..n (the devkit's ground truth is by line: names must run 1..n)."""
    index = {w: i for i, w in enumerate(wnids)}
    with open(VAL_TRUTH, newline="") as f:
        rows = [(r["filename"], index[r["wnid"]]) for r in csv.DictReader(f)]
    if val_total >= len(rows):
        return rows
    per_class, taken = max(1, val_total // len(wnids)), [0] * len(wnids)
    kept = []
    for _name, label in rows:
        if taken[label] < per_class:
            taken[label] += 1
            kept.append(label)
    return [(f"ILSVRC2012_val_{i + 1:08d}.JPEG", label) for i, label in enumerate(kept)]


def images(train_total: int, val_total: int) -> int:
    """The images `build(out, train_total, val_total)` writes."""
    return sum(class_counts(train_total)) + len(val_rows(val_total, [w for w, _ in load_synsets()]))


def _train_jobs(wnids: list[str], counts: list[int]) -> list[tuple[int, str, int, int, dict[int, str]]]:
    total = sum(counts)
    quirks = dict(sample._quirk_positions(total, sample.TRAIN_QUIRKS).items())
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    return [
        (label, wnid, first, n, {s: q for s, q in quirks.items() if first <= s < first + n})
        for label, (wnid, first, n) in enumerate(zip(wnids, starts, counts, strict=True))
    ]


def _val_jobs(
    rows: list[tuple[str, int]], starts: list[int]
) -> Iterator[tuple[int, list[tuple[str, int]], int, dict[int, int], dict[int, int]]]:
    serial0 = starts[-1]  # val serials follow train's
    spread = [(2 * k + 1) * len(rows) // (2 * PLANTED) for k in range(min(PLANTED, len(rows)))]
    planted = {i: starts[rows[i][1]] for i in spread}  # the first train image of the val image's class
    quirk_at = {
        pos: k for k, pos in enumerate(sample._quirk_positions(len(rows), sample.VAL_QUIRKS)) if pos not in planted
    }
    for start in range(0, len(rows), VAL_BLOCK):
        block = rows[start : start + VAL_BLOCK]
        inside = range(start, start + len(block))
        yield (
            start,
            block,
            serial0,
            {i: s for i, s in planted.items() if i in inside},
            {i: k for i, k in quirk_at.items() if i in inside},
        )


def _devkit(
    wnids: list[tuple[str, str]], counts: list[int], rows: list[tuple[str, int]]
) -> list[tuple[str, bytes | None]]:
    ids = sample._leaf_ids(np.random.default_rng(0), len(wnids))
    records = sample._synset_records(wnids, ids, max(counts))
    by_wnid = dict(zip((w for w, _ in wnids), counts, strict=True))
    for rec in records:
        rec["num_train_images"] = by_wnid.get(rec["WNID"], rec["num_train_images"])
    return sample._devkit_members(records, [ids[label] for _, label in rows])


def build(out: Path, train_total: int = TRAIN_IMAGES, val_total: int = VAL_IMAGES, workers: int = 2) -> dict[str, str]:
    """Write the three archives and sample_md5.tsv into `out` (the md5 table last: its presence marks a whole
    set); return {archive: md5}."""
    out.mkdir(parents=True, exist_ok=True)
    synsets = load_synsets()
    wnids = [w for w, _ in synsets]
    counts = class_counts(train_total)
    rows = val_rows(val_total, wnids)
    starts = [*np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist(), sum(counts)]
    started = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(workers, initializer=sources) as pool:
        tars = pool.imap(class_tar, _train_jobs(wnids, counts))
        sample._write_tar(out / ARCHIVES["train"], ((f"{w}.tar", t) for w, t in zip(wnids, tars, strict=True)))
        blocks = pool.imap(val_block, _val_jobs(rows, starts))
        sample._write_tar(out / ARCHIVES["val"], (m for block in blocks for m in block))
    sample._write_tar_gz(out / ARCHIVES["devkit"], _devkit(synsets, counts, rows))
    md5s = {name: compute_md5(out / name, progress=False) for name in ARCHIVES.values()}
    write_text(out / sample.MD5_TABLE, "name\tmd5\n" + "".join(f"{n}\t{m}\n" for n, m in md5s.items()))
    print(
        f"{out.name}: {sum(counts):,} train + {len(rows):,} val images in {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    return md5s


def appended(src: Path, out: Path, fraction: float = 0.01) -> dict[str, str]:
    """The archive set of `src` with `fraction` more train images in every class (at least one each; new names,
    new pictures, after the class's own members in its tar), val and devkit the same files (hard links): the
    next release of a dataset that grew by `fraction`. Returns {archive: md5}."""
    out.mkdir(parents=True, exist_ok=True)
    index = {w: i for i, (w, _) in enumerate(load_synsets())}
    serial = images(TRAIN_IMAGES, VAL_IMAGES)  # past every serial of the full set
    with tarfile.open(src / ARCHIVES["train"]) as outer:

        def classes() -> Iterator[tuple[str, bytes]]:
            nonlocal serial
            for member in outer:
                data = outer.extractfile(member)
                assert data is not None, member.name
                members = _members(data.read())
                wnid, label = member.name[: -len(".tar")], index[member.name[: -len(".tar")]]
                more = _more(wnid, label, members, fraction, serial)
                serial += len(more)
                members += more
                yield member.name, sample._tar_bytes(members)

        sample._write_tar(out / ARCHIVES["train"], classes())
    for key in ("val", "devkit"):
        (out / ARCHIVES[key]).unlink(missing_ok=True)
        os.link(src / ARCHIVES[key], out / ARCHIVES[key])
    md5s = {name: compute_md5(out / name, progress=False) for name in ARCHIVES.values()}
    write_text(out / sample.MD5_TABLE, "name\tmd5\n" + "".join(f"{n}\t{m}\n" for n, m in md5s.items()))
    return md5s


def _members(tar: bytes) -> list[tuple[str, bytes | None]]:
    """(name, bytes) of every member of a class tar, in order."""
    out: list[tuple[str, bytes | None]] = []
    with tarfile.open(fileobj=io.BytesIO(tar)) as inner:
        for member in inner:
            data = inner.extractfile(member)
            assert data is not None, member.name
            out.append((member.name, data.read()))
    return out


def _more(
    wnid: str, label: int, members: list[tuple[str, bytes | None]], fraction: float, serial: int
) -> list[tuple[str, bytes | None]]:
    """`fraction` of a class's images more (>= 1), numbered apart from its existing names."""
    taken = {int(name.rsplit("_", 1)[1].split(".")[0]) for name, _ in members}
    free = np.setdiff1d(np.arange(1, 50_001), np.fromiter(taken, dtype=np.int64))
    count = max(1, round(len(members) * fraction))
    numbers = np.sort(np.random.default_rng([10, label]).choice(free, size=count, replace=False))
    return [
        (f"{wnid}_{n}.JPEG", encoded(picture(serial + k, label), serial + k, _quality(serial + k), None))
        for k, n in enumerate(numbers.tolist())
    ]


def _cli() -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.full_count", description=build.__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--train", type=int, default=TRAIN_IMAGES)
    parser.add_argument("--val", type=int, default=VAL_IMAGES)
    args = parser.parse_args()
    build(args.out, args.train, args.val)


if __name__ == "__main__":
    _cli()
