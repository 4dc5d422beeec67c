"""Read-ahead: the iterable dataset loads row groups in a bounded background thread and asks the kernel for the
ones after (POSIX_FADV_WILLNEED on their byte ranges); the map-style dataset asks for a whole DataLoader batch
first. Order, partitioning and determinism are those of the synchronous reader."""
from __future__ import annotations

import os
import threading
import time

import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset
from imagenet_parquet.readahead import read_ahead
from imagenet_parquet.indexed import IndexedReader
from tasks.common.shard_writer import ShardWriter
from tests.helpers.datasets import write_shards
from tests.helpers.images import identify

TOTAL = 47


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("parquet")
    for path in write_shards(root, total=TOTAL, shards=3, row_group_rows=4):
        table = pq.read_table(path)  # as convert writes: with the footer's byte index
        ShardWriter(path, table.schema, 4).write(iter(table.to_pylist()))
    return root


def test_read_ahead_keeps_order_and_stays_within_depth():
    loaded, consumed = [], []

    def load(k: int) -> int:
        loaded.append(k)
        return k * 10

    for value in read_ahead(list(range(20)), load, depth=3):
        time.sleep(0.002)  # the consumer is slower: the thread must wait, not run ahead
        assert len(loaded) - len(consumed) <= 3 + 2  # queued + being loaded + being consumed
        consumed.append(value)
    assert consumed == [k * 10 for k in range(20)] == [v * 10 for v in loaded]


def test_read_ahead_hints_each_key_once_raises_errors_and_stops_when_closed():
    hinted: list[int] = []
    got = list(read_ahead(list(range(10)), lambda k: k, depth=0, hint=hinted.extend, hint_ahead=3))
    assert got == list(range(10)) and hinted == list(range(10))

    def fail(k: int) -> int:
        if k == 4:
            raise OSError("disk gone")
        return k

    seen = []
    with pytest.raises(OSError, match="disk gone"):
        for value in read_ahead(list(range(10)), fail, depth=2):
            seen.append(value)
    assert seen == [0, 1, 2, 3]
    before = threading.active_count()
    it = read_ahead(list(range(1000)), lambda k: k, depth=2)
    assert next(it) == 0
    it.close()  # a consumer that stops early (break): the thread ends
    assert threading.active_count() <= before


def _fadvised(monkeypatch) -> list[tuple[str, int, int, int]]:
    calls: list[tuple[str, int, int, int]] = []
    real = os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length, advice))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", record)
    return calls


def test_iterable_read_ahead_same_rows_as_synchronous_and_willneed_on_its_images(shards, monkeypatch):
    sync = ParquetIterableDataset(shards, "train", transform=identify, read_ahead=0, seed=2, rank=1, world_size=2)
    ahead = ParquetIterableDataset(shards, "train", transform=identify, read_ahead=2, seed=2, rank=1, world_size=2)
    for epoch in (0, 1):
        sync.set_epoch(epoch)
        ahead.set_epoch(epoch)
        assert [i for i, _ in ahead] == [i for i, _ in sync]
        loader = lambda ds: [int(i) for ids, _ in DataLoader(ds, batch_size=5, num_workers=2) for i in ids]  # noqa: E731
        assert loader(ahead) == loader(sync)
    calls = _fadvised(monkeypatch)
    rows = [i for i, _ in ahead]
    assert len(rows) == len(ahead)
    index = IndexedReader(ahead.files)
    images = {}
    for row in rows:
        file, file_row = ahead.index.locate_file(ahead.index.locate(row)[0], row)
        offset, size = (int(x) for x in index._entry(file)[1][file_row])
        images[(str(ahead.files[file].resolve()), offset - 4, offset + size)] = row  # length prefix + bytes
    asked = [(path, offset, offset + length) for path, offset, length, advice in calls
             if advice == os.POSIX_FADV_WILLNEED]
    assert sorted(asked) == sorted(images)  # exactly this rank's images (length prefix + bytes), each once
    with pytest.raises(ValueError, match="read_ahead"):
        ParquetIterableDataset(shards, "train", read_ahead=-1)


def test_map_style_batch_asks_for_every_image_first(shards, monkeypatch):
    ds = ParquetImageDataset(shards, "train", decode=False)
    batch = [40, 3, 17, 25, -1]
    expected = [ds[i] for i in batch]
    calls = _fadvised(monkeypatch)
    assert ds.__getitems__(batch) == expected
    willneed = [c for c in calls if c[3] == os.POSIX_FADV_WILLNEED]
    assert len(willneed) == len(batch) and all(length > 4 for _, _, length, _ in willneed)
    loaded = [int(i) for ids, _ in DataLoader(ParquetImageDataset(shards, "train", transform=identify),
                                               batch_size=6, shuffle=True, num_workers=2) for i in ids]
    assert sorted(loaded) == list(range(TOTAL))
