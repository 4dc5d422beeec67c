"""Every reader path applies the curation overlay (issue 27): curated labels, excluded images skipped, the epoch
order a function of (seed, epoch) over the kept rows, elastic and resumable; a tampered or stale overlay, or
shards that need one and have none, are refused with one clear message. Remote: the overlay of the version is
fetched, checked against the md5 its listing vouches for, and every shard footer against the overlay."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, RowGroupSampler
from imagenet_parquet.format import FormatError, shard_schema
from imagenet_parquet.overlay import (
    OVERLAY_KEY,
    OverlayError,
    footer_digest,
    footer_tail,
    overlay_table,
    write_overlay,
)
from tasks.common.shard_writer import ShardWriter
from tests.helpers.datasets import numbered_label_map, write_shards
from tests.helpers.dvc_remote import run
from tests.helpers.images import identify
from tests.helpers.project import GIT
from tests.helpers.range_files import serving

TOTAL, CLASSES = 47, 3


def _converted(files: list[Path]) -> np.ndarray:
    return np.concatenate([pq.read_table(f, columns=["label"]).column(0).to_numpy() for f in files])


def write_curation(root: Path, files: list[Path], seed: int = 0, split: str = "train") -> dict[int, int]:
    """An overlay for `files` relabelling ~10 % and excluding ~10 % of the rows at random: {kept row: label}."""
    labels = _converted(files)
    rng = np.random.default_rng(seed)
    picked = rng.permutation(len(labels))
    relabel, exclude = picked[: len(labels) // 10], picked[len(labels) // 10 : len(labels) // 5]
    labels = labels.copy()
    labels[relabel] = (labels[relabel] + 1) % CLASSES
    keep = np.ones(len(labels), dtype=bool)
    keep[exclude] = False
    shards = [(f.name, pq.read_metadata(f).num_rows, footer_digest(footer_tail(f))) for f in files]
    table = overlay_table(split, shards, labels, keep, {"relabelled": len(relabel), "excluded": len(exclude)})
    (root / "overlay").mkdir(exist_ok=True)
    write_overlay(table, root / "overlay" / f"{split}.parquet")
    return {int(i): int(labels[i]) for i in np.flatnonzero(keep)}


def require_overlay(files: list[Path], row_group_rows: int = 4) -> None:
    """Rewrite `files` as convert writes them: footer byte index, and `curation: overlay` in the metadata."""
    schema = shard_schema(numbered_label_map(CLASSES), {"policy": "passthrough"}, "train", curation="overlay")
    for path in files:
        table = pq.read_table(path).cast(schema)
        ShardWriter(path, schema, row_group_rows).write(iter(table.to_pylist()))


@pytest.fixture
def curated(tmp_path) -> tuple[Path, dict[int, int]]:
    files = write_shards(tmp_path / "parquet", "train", classes=CLASSES, total=TOTAL, shards=3, row_group_rows=4)
    require_overlay(files)
    return tmp_path / "parquet", write_curation(tmp_path, files)


def _pairs(ds) -> list[tuple[int, int]]:
    return [(int(i), int(y)) for i, y in (ds[k] for k in range(len(ds)))]


def test_map_style_and_sampler_yield_the_curated_dataset(curated):
    root, want = curated
    ds = ParquetImageDataset(root, "train", transform=identify)
    assert len(ds) == len(want) < TOTAL and "curation overlay applied" in repr(ds)
    assert _pairs(ds) == sorted(want.items())
    assert ds.targets.tolist() == [want[k] for k in sorted(want)]
    assert ParquetImageDataset(root / "train" / ds.files[1].name, transform=identify)[0][0] in want  # one shard
    sampler = RowGroupSampler(ds, seed=3)
    order = list(sampler)
    assert sorted(order) == list(range(len(ds)))
    sampler.set_epoch(1)
    assert list(sampler) != order  # a new order per epoch, over the kept rows only
    loose = ParquetImageDataset(root, "train", transform=identify, overlay=False)
    assert len(loose) == TOTAL  # the labels as converted, on purpose


def test_iterable_order_is_a_function_of_seed_and_epoch_over_the_kept_rows(curated):
    root, want = curated

    def epoch(workers: int, epoch: int = 0) -> list[tuple[int, int]]:
        ds = ParquetIterableDataset(root, "train", transform=identify, batch_size=4, seed=5)
        ds.set_epoch(epoch)
        context = {"multiprocessing_context": "fork"} if workers else {}
        loader = DataLoader(ds, batch_size=4, num_workers=workers, **context)
        return [(int(i), int(y)) for ids, ys in loader for i, y in zip(ids, ys, strict=True)]

    first = epoch(0)
    assert sorted(first) == sorted(want.items())
    assert epoch(2) == first  # the same batches whatever the workers
    assert epoch(0, epoch=1) != first
    map_ds = ParquetImageDataset(root, "train", transform=identify)
    assert [map_ds[i][0] for i in RowGroupSampler(map_ds, seed=5)] == [i for i, _ in first]


def test_resume_across_a_world_size_change_then_refused_after_a_curation_change(curated, tmp_path):
    root, want = curated

    def rank(r: int, world: int, **kw) -> ParquetIterableDataset:
        return ParquetIterableDataset(root, "train", transform=identify, batch_size=2, seed=1, rank=r,
                                      world_size=world, **kw)

    steps = 5  # global steps of 2 ranks x 2 images finished before the stop
    seen = [row for r in (0, 1) for _, (row, _) in zip(range(steps * 2), rank(r, 2), strict=False)]
    rest = rank(0, 1)
    rest.load_state_dict({"epoch": 0, "samples_seen": steps * 4})
    after = [row for row, _ in rest]
    assert sorted(seen + after) == sorted(want)  # every kept image once, none excluded
    saved = rank(0, 1).state_dict()
    assert saved["num_samples"] == len(want) and saved["curation"]
    write_curation(tmp_path, sorted((root / "train").glob("*.parquet")), seed=9)  # a new curation version
    with pytest.raises(ValueError, match=r"curation=.*labels or exclusions changed"):
        rank(0, 1).load_state_dict({**saved, "num_samples": len(rank(0, 1))})


def test_tampered_stale_or_missing_overlays_are_refused(curated, tmp_path):
    root, _ = curated
    path = tmp_path / "overlay" / "train.parquet"
    table = pq.read_table(path)
    labels = table.column("label").to_numpy().copy()
    labels[0] = (labels[0] + 1) % CLASSES  # a label changed, the metadata kept
    pq.write_table(table.set_column(2, "label", pa.array(labels)), path)
    with pytest.raises(OverlayError, match="content_sha256"):
        ParquetImageDataset(root, "train")
    files = sorted((root / "train").glob("*.parquet"))
    write_curation(tmp_path, files)
    require_overlay(files[:1], row_group_rows=3)  # the shard rewritten after curation: another footer
    with pytest.raises(OverlayError, match=f"shard {files[0].name} .*footer sha256"):
        ParquetIterableDataset(root, "train")
    path.unlink()
    with pytest.raises(OverlayError, match=r"expected its curation overlay at .*overlay=False"):
        ParquetImageDataset(root, "train")
    assert len(ParquetImageDataset(root, "train", overlay=False)) == TOTAL
    path.write_bytes(b"PAR1 not an overlay")
    with pytest.raises(OverlayError, match="expected a curation overlay"):
        ParquetImageDataset(root, "train")


def test_a_damaged_label_is_one_error_naming_the_shard_and_row(tmp_path):
    files = write_shards(tmp_path / "parquet", "train", classes=CLASSES, total=12, shards=1, row_group_rows=4)
    table = pq.read_table(files[0])
    labels = table.column("label").to_pylist()
    for bad, match in ((None, "row 5: expected a label, found none"), (7, "row 5: expected a label in 0..2")):
        labels[5] = bad
        damaged = table.set_column(1, pa.field("label", pa.int64()), pa.array(labels, pa.int64()))
        ShardWriter(files[0], table.schema, 4).write(iter(damaged.to_pylist()))
        with pytest.raises(FormatError, match=match):
            [ParquetImageDataset(files[0])[i] for i in range(12)]


def curated_project(root: Path) -> dict[str, Path]:
    """A DVC project whose data/parquet (convert) and data/overlay (curate) are outs, pushed; a clone never pulls."""
    repo, remote = root / "repo", root / "remote"
    repo.mkdir()
    run(["git", "init", "-q"], repo)
    run(["dvc", "init", "-q"], repo)
    files = write_shards(repo / "data" / "parquet", "train", classes=CLASSES, total=TOTAL, shards=3, row_group_rows=5)
    (repo / "data" / "parquet" / "label_map.json").unlink()
    require_overlay(files, row_group_rows=5)
    want = write_curation(repo / "data", files)
    run(["dvc", "stage", "add", "-q", "-n", "convert", "-o", "data/parquet", "true"], repo)
    run(["dvc", "stage", "add", "-q", "-n", "curate", "-d", "data/parquet", "-o", "data/overlay", "true"], repo)
    run(["dvc", "commit", "-q", "-f"], repo)
    run(["dvc", "remote", "add", "-d", "store", str(remote)], repo)
    run(["dvc", "push", "-q"], repo)
    run(["git", "add", "-A"], repo)
    run([*GIT, "commit", "-qm", "curated"], repo)
    run(["git", "clone", "-q", str(repo), str(root / "node")], root)
    (root / "want.json").write_text(json.dumps(want))
    return {"repo": repo, "remote": remote, "node": root / "node"}


def _object(remote: Path, repo: Path, relpath: str) -> Path:
    lock = (repo / "dvc.lock").read_text()
    import yaml

    outs = {o["path"]: o["md5"] for s in yaml.safe_load(lock)["stages"].values() for o in s.get("outs", [])}
    out = next(p for p in outs if relpath.startswith(p + "/"))
    listing = json.loads((remote / "files" / "md5" / outs[out][:2] / outs[out][2:]).read_text())
    md5 = next(e["md5"] for e in listing if e["relpath"] == relpath[len(out) + 1 :])
    return remote / "files" / "md5" / md5[:2] / md5[2:]


def test_remote_reads_apply_the_checked_overlay_and_refuse_a_tampered_one(tmp_path):
    project = curated_project(tmp_path)
    want = {int(k): v for k, v in json.loads((tmp_path / "want.json").read_text()).items()}
    with serving(project["remote"]) as (url, _):
        def open_(cache: str, **kw):
            return ParquetImageDataset.from_dvc(project["node"], "data/parquet", split="train", remote=url,
                                                cache_dir=tmp_path / cache, transform=identify, **kw)

        ds = open_("c1")
        assert _pairs(ds) == sorted(want.items())
        shards = [_object(project["remote"], project["repo"], f"data/parquet/train/{f.name}") for f in ds.files]
        originals = [shard.read_bytes() for shard in shards]
        for shard, original in zip(shards, originals, strict=True):  # two class names swapped in every footer
            tail = footer_tail(shard)
            swapped = tail.replace(b"class 0", b"class #").replace(b"class 1", b"class 0")
            swapped = swapped.replace(b"class #", b"class 1")
            shard.chmod(0o644)
            shard.write_bytes(original[: -len(tail)] + swapped)
        with pytest.raises(OverlayError, match="footer sha256"):
            open_("c2")
        for shard, original in zip(shards, originals, strict=True):
            shard.write_bytes(original)
        overlay = _object(project["remote"], project["repo"], "data/overlay/train.parquet")
        overlay.chmod(0o644)
        data = overlay.read_bytes()
        overlay.write_bytes(data.replace(OVERLAY_KEY, OVERLAY_KEY.upper()))
        with pytest.raises(Exception, match="md5"):
            open_("c3")
        assert not list((tmp_path / "c3").rglob("overlay"))  # nothing unchecked kept in the cache
        overlay.write_bytes(data)
        shutil.rmtree(tmp_path / "c1")
        assert _pairs(open_("c1")) == sorted(want.items())


def test_other_tools_read_the_curated_view(curated):
    import datasets
    import duckdb
    import polars as pl

    from imagenet_parquet.tables import curated_sql, read_curated

    root, want = curated
    expected = [want[k] for k in sorted(want)]
    table = read_curated(root, "train", columns=["image", "label", "wnid", "label_name"])
    assert table.column("label").to_pylist() == expected
    lmap = numbered_label_map(CLASSES)["classes"]
    assert table.column("label_name").to_pylist() == [lmap[y]["name"] for y in expected]
    assert read_curated(root, "train", columns=["label"]).to_pandas()["label"].tolist() == expected
    assert pl.from_arrow(read_curated(root / "train")).get_column("label").to_list() == expected
    hf = datasets.Dataset(read_curated(root, "train"))
    assert hf["label"] == expected and hf.features["label"].names == [c["name"] for c in lmap]
    sql = duckdb.sql(curated_sql(root, "train")).fetchall()
    assert [row[1] for row in sql] == expected  # column 1: label
    naive = pq.read_table(root / "train", columns=["label"]).num_rows
    assert naive == TOTAL  # what a plain read sees: every image, labels as converted


def test_remote_labels_come_from_the_checked_overlay_never_a_fetched_label_chunk(tmp_path):
    """Issue 28 item 1: bytes flipped in every label column chunk of a remote shard (what gave wrong labels or a raw
    NaN error before) change nothing a reader yields: labels come from the overlay the listing vouches for."""
    project = curated_project(tmp_path)
    want = {int(k): v for k, v in json.loads((tmp_path / "want.json").read_text()).items()}
    with serving(project["remote"]) as (url, _):
        ds = ParquetImageDataset.from_dvc(project["node"], "data/parquet", split="train", remote=url,
                                          cache_dir=tmp_path / "c", transform=identify)
        for name in ds.files:
            shard = _object(project["remote"], project["repo"], f"data/parquet/train/{name.name}")
            meta, data = pq.read_metadata(shard), bytearray(shard.read_bytes())
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                chunks = [group.column(c) for c in range(group.num_columns)]
                chunk = next(c for c in chunks if c.path_in_schema == "label")
                middle = chunk.data_page_offset + chunk.total_compressed_size // 2
                data[middle] ^= 0x5A
            shard.chmod(0o644)
            shard.write_bytes(bytes(data))
        stream = ParquetIterableDataset.from_dvc(project["node"], "data/parquet", split="train", remote=url,
                                                 cache_dir=tmp_path / "c2", transform=identify, shuffle=False)
        assert sorted((int(i), int(y)) for i, y in stream) == sorted(want.items())
        assert _pairs(ds) == sorted(want.items())
