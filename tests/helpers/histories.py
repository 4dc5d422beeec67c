"""A small project with a layout history of two generations in both splits (issue 49's tests of the history as an
input): train and val converted (v0: a quarantined image among them), then images added to both (v1: generation
1), every file built once per test module and copied by hardlink per case (convert writes every file anew under a
temporary name, never into one: the copies share nothing they change). `truth` says what the shards on disk hold,
`fresh_rows` what a convert without history gives — the oracle a run with any history is held to."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from imagenet_parquet.format import decode_image_index, shard_generation
from tasks.convert.distribute import run_local
from tests.helpers.archives import tar_entries, write_tar
from tests.helpers.datasets import make_job, write_inputs
from tests.helpers.images import noisy_jpeg

PARAMS = {"shard_mb": 0.05, "row_group_rows": 4}
LAYOUT = "versions/layout.json"
Images = dict[str, list[tuple[str, str, bytes]]]  # split -> [(wnid, name, bytes)]


def v0() -> Images:
    train = [(f"n0{1 + i % 3}", f"img{i:03d}.JPEG", noisy_jpeg(i, size=(48, 40))) for i in range(30)]
    val = [(f"n0{1 + i % 3}", f"val{i:03d}.JPEG", noisy_jpeg(500 + i, size=(48, 40))) for i in range(9)]
    return {"train": [*train, ("n02", "zero.JPEG", b"")], "val": val}  # zero.JPEG: quarantined, never a row


def v1() -> Images:
    more = v0()
    more["train"] += [("n02", f"more{i}.JPEG", noisy_jpeg(100 + i, size=(48, 40))) for i in range(8)]
    more["val"] += [("n03", f"valmore{i}.JPEG", noisy_jpeg(600 + i, size=(48, 40))) for i in range(4)]
    return more


def write_source(root: Path, images: Images) -> None:
    """Per split a tar `data/raw/<split>.tar` of `images`, the manifests and a label map over their classes."""
    rows = {}
    for split, items in images.items():
        tar = write_tar(root / "data/raw" / f"{split}.tar", [(name, data) for _, name, data in items])
        wnid_of = {name: wnid for wnid, name, _ in items}
        rows[split] = [(wnid_of[m], f"data/raw/{tar.name}", m, o, n) for m, o, n in tar_entries(tar)]
    write_inputs(root, rows, sorted({w for items in images.values() for w, _, _ in items}))


def convert(root: Path, images: Images | None = None) -> dict:
    if images is not None:
        write_source(root, images)
    return run_local(make_job(root, **PARAMS), progress=False)


def build(base: Path) -> dict[str, Path]:
    """`base/v0` (one generation), `base/v1` (two) and `base/fresh` (v1's source converted without history)."""
    for name, versions in (("v0", [v0()]), ("v1", [v0(), v1()]), ("fresh", [v1()])):
        for images in versions:
            convert(base / name, images)
    return {name: base / name for name in ("v0", "v1", "fresh")}


def linked_copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, copy_function=os.link)
    return target


def truth(root: Path) -> dict[str, dict[str, int]]:
    """Per split what the shard files on disk hold: rows, shards, file and image bytes (their footers)."""
    out = {}
    for split in ("train", "val"):
        files = sorted((root / "data/parquet" / split).glob("*.parquet"))
        metas = [pq.read_metadata(f) for f in files]
        index = [decode_image_index(m.metadata, m.num_rows, f) for f, m in zip(files, metas)]
        out[split] = {"rows": sum(m.num_rows for m in metas), "shards": len(files),
                      "file_bytes": sum(f.stat().st_size for f in files),
                      "image_bytes": int(sum(i[:, 1].sum() for i in index if i is not None))}
    return out


def newest_rows(root: Path, split: str) -> dict[tuple[str, str], str]:
    """(wnid, name) -> sha256 of the newest row of every image the shards hold (highest generation wins)."""
    found: dict[tuple[str, str], tuple[int, str]] = {}
    for path in sorted((root / "data/parquet" / split).glob("*.parquet")):
        generation = shard_generation(pq.read_schema(path).metadata)
        for row in pq.read_table(path, columns=["wnid", "image", "sha256"]).to_pylist():
            key = (row["wnid"], row["image"]["path"])
            if key not in found or found[key][0] <= generation:
                found[key] = (generation, row["sha256"])
    return {key: sha for key, (_, sha) in found.items()}


def manifest_keys(root: Path, split: str) -> set[tuple[str, str]]:
    table = pq.read_table(root / "data/manifests" / f"{split}.parquet", columns=["wnid", "name"])
    return set(zip(table.column("wnid").to_pylist(), table.column("name").to_pylist()))


def bad_keys(root: Path, split: str) -> set[tuple[str, str]]:
    layout = json.loads((root / LAYOUT).read_text())
    return {(b["class"], b["record"]["name"]) for g in layout["splits"].get(split, []) for b in g["bad"]}


def assert_true_run(root: Path, fresh: Path, metrics: dict) -> None:
    """A clean run: its metrics are what the shards hold, no image of the source is lost, every image reads as a
    fresh convert's, and the history it wrote is accepted by the next run, which finds nothing new."""
    from tasks.convert.stage import prepare

    written = json.loads((root / "data/metrics/convert.json").read_text())
    assert {k: metrics[k] for k in written} == written
    real = truth(root)
    bad_lines = (root / "data/parquet/bad_images.jsonl").read_text().splitlines()
    assert written["bad_images"] == len(bad_lines)
    for split, counts in real.items():
        assert {k: written["splits"][split][k] for k in counts} == counts, (split, written, real)
        rows = newest_rows(root, split)
        listed = manifest_keys(root, split)
        assert listed <= set(rows) | bad_keys(root, split), "an image of the source is in no shard"
        fresh_rows = newest_rows(fresh, split)
        assert {k: v for k, v in rows.items() if k in listed} == fresh_rows
        assert written["splits"][split]["input_bytes"] >= _plain_bytes(root, split)
    assert prepare(make_job(root, **PARAMS)) == []  # the written history holds: nothing new, every check passes


def _plain_bytes(root: Path, split: str) -> int:
    total = 0
    for path in sorted((root / "data/parquet" / split).glob("*.parquet")):
        table = pq.read_table(path, columns=["image", "transform"])
        sizes = np.array([len(r["bytes"]) for r in table.column("image").to_pylist()], dtype=np.int64)
        total += int(sizes[np.array(table.column("transform").to_pylist()) == "none"].sum())
    return total
