"""The built-in sample: a deterministic miniature ILSVRC2012 release with the real archive layout.

`write_sample(out_dir)` writes `ILSVRC2012_img_train.tar` (one uncompressed `<wnid>.tar` per class holding
`<wnid>_<n>.JPEG`, n not fixed-width), `ILSVRC2012_img_val.tar` (flat `ILSVRC2012_val_%08d.JPEG`),
`ILSVRC2012_devkit_t12.tar.gz` (`data/meta.mat` + `data/ILSVRC2012_validation_ground_truth.txt`) and
`sample_md5.tsv`. Images are drawn procedurally (or taken from a folder of real JPEGs) and include the real
quirks: a CMYK JPEG, a grayscale JPEG, a PNG named .JPEG and an EXIF-rotated JPEG.
Same arguments ⇒ byte-identical archives (fixed member order, mtimes, owners; gzip header without name/time)."""

from __future__ import annotations

import argparse
import gzip
import io
import itertools
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import scipy.io
from PIL import Image, ImageDraw

from tasks.acquire.md5state import compute_md5
from tasks.common import ARCHIVES, atomic_path, write_text
from tasks.common.synsets import load_synsets

MTIME = 1_335_000_000  # fixed member mtime (April 2012, like the real release)
MD5_TABLE = "sample_md5.tsv"
DEVKIT_ROOT = "ILSVRC2012_devkit_t12"
META_FIELDS = (
    "ILSVRC2012_ID",
    "WNID",
    "words",
    "gloss",
    "num_children",
    "children",
    "wordnet_height",
    "num_train_images",
)  # the real meta.mat field order (torchvision indexes them by position)
TRAIN_QUIRKS = ("cmyk", "gray", "png", "exif_rotated")
VAL_QUIRKS = ("gray", "cmyk")
ANIMALS_END = "n02666196"  # first non-animal leaf wnid (abacus): splits the sample's two internal nodes


# ---------------------------------------------------------------- images
def _draw(rng: np.random.Generator, label: int) -> Image.Image:
    """A 300–500 px RGB picture in the class's own hue (so a contact sheet shows a misplaced label at a glance):
    smooth colour field, a few discs, mild noise (≈ 30–60 KB as JPEG)."""
    width, height = (int(v) for v in rng.integers(300, 501, 2))
    hue = int((label * 0.618034 % 1.0) * 255)  # golden-ratio hues: neighbouring classes look different
    rows, cols = int(rng.integers(6, 20)), int(rng.integers(6, 20))
    grid = np.stack(
        [
            (hue + rng.integers(-12, 13, (rows, cols))) % 256,
            rng.integers(110, 256, (rows, cols)),
            rng.integers(90, 256, (rows, cols)),
        ],
        axis=-1,
    ).astype(np.uint8)
    image = Image.fromarray(grid, "HSV").convert("RGB").resize((width, height), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(image)
    for _ in range(6):
        x, y, r = int(rng.integers(0, width)), int(rng.integers(0, height)), int(rng.integers(10, 80))
        shade = tuple(int(c) for c in rng.integers(0, 256, 3))
        draw.ellipse((x - r, y - r, x + r, y + r), fill=shade if rng.random() < 0.3 else (255, 255, 255))
    noise = rng.integers(-12, 13, (height, width, 1), dtype=np.int16)
    return Image.fromarray(np.clip(np.asarray(image, dtype=np.int16) + noise, 0, 255).astype(np.uint8))


def _encode(image: Image.Image, quirk: str | None) -> bytes:
    buf = io.BytesIO()
    if quirk == "cmyk":
        image.convert("CMYK").save(buf, "JPEG", quality=85)
    elif quirk == "gray":
        image.convert("L").save(buf, "JPEG", quality=85)
    elif quirk == "png":
        image.save(buf, "PNG")
    elif quirk == "exif_rotated":
        exif = Image.Exif()
        exif[0x0112] = 6  # Orientation: rotate 90° CW to display
        image.save(buf, "JPEG", quality=85, exif=exif.tobytes())
    else:
        image.save(buf, "JPEG", quality=85)
    return buf.getvalue()


class ImageSource:
    """Image bytes on demand: drawn from the seed, or the next real JPEG of a folder (sorted, cycled)."""

    def __init__(self, rng: np.random.Generator, real_images: Path | None) -> None:
        self.rng = rng
        self.real: Iterator[Path] | None = None
        if real_images is not None:
            files = sorted(p for p in Path(real_images).iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
            if not files:
                raise FileNotFoundError(f"{real_images}: expected JPEG files, found none")
            self.real = itertools.cycle(files)

    def next(self, quirk: str | None, label: int) -> bytes:
        if quirk is None and self.real is not None:
            return next(self.real).read_bytes()
        return _encode(_draw(self.rng, label), quirk)


# ---------------------------------------------------------------- tar writing
def _info(name: str, size: int, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = size, MTIME, 0, 0, "", ""
    info.mode = 0o755 if directory else 0o644
    if directory:
        info.type, info.size = tarfile.DIRTYPE, 0
    return info


def _tar_bytes(members: list[tuple[str, bytes | None]]) -> bytes:
    """An uncompressed GNU tar of (name, data) in the given order; data None = a directory entry."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            if data is None:
                tar.addfile(_info(name, 0, directory=True))
            else:
                tar.addfile(_info(name, len(data)), io.BytesIO(data))
    return buf.getvalue()


def _write_tar(path: Path, members: Iterator[tuple[str, bytes]]) -> None:
    """Stream (name, data) members into an uncompressed tar at `path`, atomically."""
    with atomic_path(path) as tmp, tarfile.open(tmp, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            tar.addfile(_info(name, len(data)), io.BytesIO(data))


def _write_tar_gz(path: Path, members: list[tuple[str, bytes | None]]) -> None:
    """A .tar.gz whose gzip header has mtime 0 and no file name (so the bytes depend only on the members)."""
    with (
        atomic_path(path) as tmp,
        open(tmp, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
    ):
        gz.write(_tar_bytes(members))


# ---------------------------------------------------------------- layout
def _pick_classes(rng: np.random.Generator, classes: int) -> list[tuple[str, str]]:
    synsets = load_synsets()
    if not 1 <= classes <= len(synsets):
        raise ValueError(f"classes must be in 1..{len(synsets)}, got {classes}")
    chosen = sorted(rng.choice(len(synsets), size=classes, replace=False).tolist())
    return [synsets[i] for i in chosen]


def _train_numbers(rng: np.random.Generator, count: int) -> list[int]:
    """`count` distinct image numbers of varying width (1..50000, log-uniform), ascending numerically."""
    numbers: set[int] = set()
    while len(numbers) < count:
        numbers.add(int(10 ** rng.uniform(0, np.log10(50_000))))
    return sorted(numbers)


def _quirk_positions(total: int, quirks: tuple[str, ...]) -> dict[int, str]:
    """Spread the quirks over `total` images at distinct flat positions (as many as fit)."""
    count = min(len(quirks), total)
    return {(j * total) // count: quirks[j] for j in range(count)} if count else {}


def _train_members(
    classes: list[tuple[str, str]], per_class: int, images: ImageSource, rng: np.random.Generator
) -> Iterator[tuple[str, bytes]]:
    quirks = _quirk_positions(len(classes) * per_class, TRAIN_QUIRKS)
    flat = 0
    for label, (wnid, _words) in enumerate(classes):
        inner: list[tuple[str, bytes | None]] = []
        for number in _train_numbers(rng, per_class):
            inner.append((f"{wnid}_{number}.JPEG", images.next(quirks.get(flat), label)))
            flat += 1
        yield f"{wnid}.tar", _tar_bytes(inner)


def _leaf_ids(rng: np.random.Generator, count: int) -> list[int]:
    """ILSVRC2012_IDs 1..count for the wnid-sorted classes, in an order that is not the sorted order."""
    ids: list[int] = (rng.permutation(count) + 1).tolist()
    if count > 1 and ids == sorted(ids):
        ids.reverse()
    return ids


def _val_members(labels: list[int], images: ImageSource) -> Iterator[tuple[str, bytes]]:
    quirks = _quirk_positions(len(labels), VAL_QUIRKS)
    for index in range(len(labels)):
        yield f"ILSVRC2012_val_{index + 1:08d}.JPEG", images.next(quirks.get(index), labels[index])


Record = dict[str, Any]  # one row of meta.mat's `synsets` struct array


def _record(ident: int, wnid: str, words: str, gloss: str, children: list[int], height: int, images: int) -> Record:
    return {
        "ILSVRC2012_ID": ident,
        "WNID": wnid,
        "words": words,
        "gloss": gloss,
        "num_children": len(children),
        "children": children,
        "wordnet_height": height,
        "num_train_images": images,
    }


def _synset_records(classes: list[tuple[str, str]], ids: list[int], per_class: int) -> list[Record]:
    """meta.mat rows in ILSVRC2012_ID order: the K leaves (IDs 1..K), then a root and its internal nodes."""
    leaves = [
        _record(i, w, words, f"sample class: {words}", [], 0, per_class)
        for i, (w, words) in zip(ids, classes, strict=True)
    ]
    inner = _internal_nodes(leaves, len(classes) + 2, per_class)
    children = [n["ILSVRC2012_ID"] for n in inner]
    root = _record(len(classes) + 1, "n00001740", "entity", "sample root node", children, 2, per_class * len(classes))
    return sorted(leaves + [root] + inner, key=lambda rec: rec["ILSVRC2012_ID"])


def _internal_nodes(leaves: list[Record], first_id: int, per_class: int) -> list[Record]:
    """The sample's two internal nodes (animals, objects) over the leaves they hold, IDs from `first_id` on."""
    groups: list[tuple[str, str, Callable[[str], bool]]] = [
        ("n00015388", "animal, animate being, beast, brute, creature, fauna", lambda w: w < ANIMALS_END),
        ("n00002684", "object, physical object", lambda w: w >= ANIMALS_END),
    ]
    inner: list[Record] = []
    for wnid, words, member in groups:
        kids = sorted(leaf["ILSVRC2012_ID"] for leaf in leaves if member(leaf["WNID"]))
        if kids:
            ident = first_id + len(inner)
            inner.append(_record(ident, wnid, words, f"sample node: {words}", kids, 1, per_class * len(kids)))
    return inner


def _meta_mat(records: list[Record]) -> bytes:
    """MATLAB 5 bytes of a struct array `synsets` with the real fields, without savemat's timestamp header."""
    synsets = np.zeros((len(records),), dtype=[(field, object) for field in META_FIELDS])
    for row, rec in enumerate(records):
        for field in META_FIELDS:
            value = rec[field]
            if field == "children":
                value = np.array(value, dtype=np.uint16).reshape(1, -1)
            elif field == "num_train_images":
                value = np.uint32(value)
            elif not isinstance(value, str):
                value = np.uint16(value)
            synsets[row][field] = value
    buf = io.BytesIO()
    scipy.io.savemat(buf, {"synsets": synsets}, do_compression=False, oned_as="column")
    data = bytearray(buf.getvalue())
    data[:116] = b"MATLAB 5.0 MAT-file, imagenet-parquet built-in sample".ljust(116)  # fixed text, no time
    return bytes(data)


def _devkit_members(records: list[Record], val_ids: list[int]) -> list[tuple[str, bytes | None]]:
    truth = "".join(f"{i}\n" for i in val_ids).encode()
    readme = b"Built-in sample shaped like the ILSVRC2012 development kit (t1/t2).\n"
    return [
        (f"{DEVKIT_ROOT}/", None),
        (f"{DEVKIT_ROOT}/readme.txt", readme),
        (f"{DEVKIT_ROOT}/data/", None),
        (f"{DEVKIT_ROOT}/data/meta.mat", _meta_mat(records)),
        (f"{DEVKIT_ROOT}/data/ILSVRC2012_validation_ground_truth.txt", truth),
        (f"{DEVKIT_ROOT}/data/ILSVRC2012_validation_blacklist.txt", b"1\n"),
    ]


def write_sample(
    out_dir: str | Path,
    classes: int = 10,
    train_per_class: int = 20,
    val_per_class: int = 5,
    seed: int = 0,
    real_images: str | Path | None = None,
    image_source: type[ImageSource] = ImageSource,
) -> dict[str, str]:
    """Write the three sample archives and `sample_md5.tsv` into out_dir; return {archive name: md5}. `image_source`:
    where the image bytes come from (a subclass draws other bytes in the same order: benchmarks/mirror.py)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    chosen = _pick_classes(rng, classes)
    ids = _leaf_ids(rng, classes)
    val_labels = rng.permutation(np.repeat(np.arange(classes), val_per_class)).tolist()
    images = image_source(rng, Path(real_images) if real_images is not None else None)
    _write_tar(out / ARCHIVES["train"], _train_members(chosen, train_per_class, images, rng))
    _write_tar(out / ARCHIVES["val"], _val_members(val_labels, images))
    records = _synset_records(chosen, ids, train_per_class)
    _write_tar_gz(out / ARCHIVES["devkit"], _devkit_members(records, [ids[label] for label in val_labels]))
    md5s = {name: compute_md5(out / name, progress=False) for name in ARCHIVES.values()}
    write_text(out / MD5_TABLE, "name\tmd5\n" + "".join(f"{n}\t{m}\n" for n, m in md5s.items()))
    return md5s


def _cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tasks.acquire.sample", description=write_sample.__doc__)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--train-per-class", type=int, default=20)
    parser.add_argument("--val-per-class", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--real-images", type=Path, default=None, help="folder of real JPEGs to use instead")
    args = parser.parse_args(argv)
    md5s = write_sample(
        args.out_dir, args.classes, args.train_per_class, args.val_per_class, args.seed, args.real_images
    )
    for name, md5 in md5s.items():
        print(f"{md5}  {args.out_dir / name}")


if __name__ == "__main__":
    _cli()
