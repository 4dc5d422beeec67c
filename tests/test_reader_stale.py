"""Issue 36 item 2: a reader checks each shard when it opens it (in every process: DataLoader workers open files on
first use), against what the dataset was built from — the overlay's footer SHA-256 and row count, or the footer
the index was built from without one. A shard replaced (`dvc repro`, `dvc pull`) or deleted after the dataset was
built is one clear error naming it and what to do, never a wrong label nor a raw IndexError/FileNotFoundError; a
shard missing from a split its overlay lists is refused when the dataset is built, not skipped."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, RowGroupSampler
from imagenet_parquet.format import FormatError
from imagenet_parquet.overlay import OverlayError
from tests.helpers.datasets import write_shards
from tests.helpers.images import identify
from tests.test_overlay_reader import CLASSES, TOTAL, require_overlay, write_curation

STALE = r"expected the shard this dataset was built from.*build the dataset again"


@pytest.fixture
def curated(tmp_path) -> tuple[Path, dict[int, int]]:
    files = write_shards(tmp_path / "parquet", "train", classes=CLASSES, total=TOTAL, shards=3, row_group_rows=4)
    require_overlay(files)  # the footer byte index: images read by pread
    return tmp_path / "parquet", write_curation(tmp_path, files)


def _replace(victim: Path, other: Path) -> None:
    """`victim` replaced by another valid shard, as `dvc repro`/`dvc checkout` replace a file (a new inode)."""
    shutil.copyfile(other, victim.with_suffix(".tmp"))
    os.replace(victim.with_suffix(".tmp"), victim)


def _drain(items, want: dict[int, int]) -> None:
    """Iterate `items` of (image id, label): every label yielded is the right one, until the error."""
    for image, label in items:
        assert want[int(image)] == int(label), "a wrong label reached the loop"


def test_map_style_refuses_a_shard_replaced_after_the_dataset_was_built(curated):
    root, want = curated
    ds = ParquetImageDataset(root, "train", transform=identify)
    files = list(ds.files)
    _replace(files[0], files[1])  # the first rows' images now come from another shard's file
    with pytest.raises(FormatError, match=f"{files[0].name}: {STALE}"):
        _drain((ds[i] for i in range(len(ds))), want)
    sampler = RowGroupSampler(ds, seed=2)
    with pytest.raises(FormatError, match=STALE):
        _drain((ds[i] for i in sampler), want)


def test_dataloader_workers_refuse_a_replaced_shard_never_yield_a_wrong_label(curated):
    """Files open on first use in each worker (forked per epoch): a shard replaced between the build and the
    epoch is refused there, whatever the worker."""
    root, want = curated
    map_ds = ParquetImageDataset(root, "train", transform=identify)
    stream = ParquetIterableDataset(root, "train", transform=identify, batch_size=4, seed=1)
    assert len(map_ds[0]) == 2  # this process already has a shard open: the workers open their own
    _replace(map_ds.files[1], map_ds.files[2])
    for ds, sampler in ((map_ds, RowGroupSampler(map_ds, seed=3)), (map_ds, None), (stream, None)):
        loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, multiprocessing_context="fork")
        with pytest.raises(FormatError, match=f"{map_ds.files[1].name}: {STALE}"):
            _drain(((i, y) for ids, ys in loader for i, y in zip(ids, ys, strict=True)), want)


def test_a_shard_deleted_after_the_build_is_one_error_and_before_it_is_refused(curated):
    root, want = curated
    ds = ParquetIterableDataset(root, "train", transform=identify, shuffle=False)
    gone = ds.files[2]
    gone.unlink()
    with pytest.raises(FormatError, match=f"{gone.name}: expected the shard this dataset was built from, found no"):
        _drain(ds, want)
    with pytest.raises(OverlayError, match=f"expected shard {gone.name} .*found no such file"):
        ParquetImageDataset(root, "train")  # the split is read whole: its overlay names a shard that is gone
    assert len(ParquetImageDataset([ds.files[0]], transform=identify)) > 0  # a shard picked by name: allowed


def test_without_an_overlay_the_open_file_is_checked_against_the_index(tmp_path):
    """Shards without the byte index (row-group reads) and without an overlay: the footer the index was built from."""
    files = write_shards(tmp_path / "parquet", "train", classes=CLASSES, total=TOTAL, shards=3, row_group_rows=4)
    ds = ParquetImageDataset(tmp_path / "parquet", "train", transform=identify)
    assert ds.overlay is None and ds._indexed.read(0, 0) is None  # the row-group path
    want = {i: int(y) for i, y in enumerate(pq.read_table(tmp_path / "parquet" / "train").column("label"))}
    _replace(files[1], files[0])
    with pytest.raises(FormatError, match=f"{files[1].name}: {STALE}"):
        _drain((ds[i] for i in range(len(ds))), want)
    with pytest.raises(FormatError, match=STALE):
        ds.targets  # noqa: B018


def test_the_check_costs_one_footer_read_per_file_open(curated, monkeypatch):
    """Not per row: the footer is read and hashed when a file opens, then images are one pread each."""
    from imagenet_parquet import shards

    root, want = curated
    ds = ParquetImageDataset(root, "train", transform=identify)
    calls = []
    real = shards.tail_at
    monkeypatch.setattr(shards, "tail_at", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert [(int(i), int(y)) for i, y in (ds[k] for k in range(len(ds)))] == sorted(want.items())
    assert len(calls) == len(ds.files)


@pytest.mark.parametrize("persistent", [False, True])
def test_a_curation_only_change_during_a_run_keeps_the_old_labels_consistently(curated, persistent):
    """Issue 36, a case not yet run: a new data/overlay (a curation-only `dvc repro`, shards untouched) written while
    a DataLoader runs, with persistent or per-epoch workers: every label of the run is the old curation's (the
    overlay was read when the dataset was built), never a mix; a dataset built after it has the new labels."""
    root, want = curated
    files = sorted((root / "train").glob("*.parquet"))
    for make in (
        lambda: ParquetImageDataset(root, "train", transform=identify),
        lambda: ParquetIterableDataset(root, "train", transform=identify, batch_size=4, seed=3),
    ):
        ds = make()
        sampler = RowGroupSampler(ds, seed=3) if isinstance(ds, ParquetImageDataset) else None
        loader = DataLoader(
            ds,
            batch_size=4,
            sampler=sampler,
            num_workers=2,
            persistent_workers=persistent,
            multiprocessing_context="fork",
        )
        seen: list[tuple[int, int]] = []
        for epoch in range(2):
            (sampler or ds).set_epoch(epoch)
            for step, (ids, ys) in enumerate(loader):
                seen += [(int(i), int(y)) for i, y in zip(ids, ys, strict=True)]
                if epoch == 0 and step == 2:
                    new = write_curation(root.parent, files, seed=11)  # the curate stage's new version
        assert len(seen) == 2 * len(want) and all(want[i] == y for i, y in seen)
        write_curation(root.parent, files)  # back to the first version for the next reader
    assert write_curation(root.parent, files, seed=11) == new != want
    assert _pairs_now(root) == new  # a dataset built after the change: the new curation


def _pairs_now(root: Path) -> dict[int, int]:
    ds = ParquetImageDataset(root, "train", transform=identify)
    return {int(i): int(y) for i, y in (ds[k] for k in range(len(ds)))}
