"""The reader part of the full-count rehearsal (bench_full_count.py), run in the pulled clone:

    python -m benchmarks.full_count_reader DATA/parquet MAP_IMAGES

A first epoch of `ParquetIterableDataset(train, crop=TrainCrop(224), batch_size=256)` through a DataLoader with 2
workers (time from opening the dataset to the first batch, img/s, each worker's peak RSS sampled from /proc); a
resume from the middle of that epoch (`{"epoch": 0, "samples_seen": n}`), its first three batches' labels checked
equal to the uninterrupted epoch's; a map-style random-access pass over MAP_IMAGES images (`ParquetImageDataset`,
DataLoader shuffle, 2 workers); the baseline of a worker's memory: the same DataLoader over a dataset that holds
nothing and yields zero tensors of TrainCrop's shape (what torch, the DataLoader and a batch cost a worker,
whatever the reader). Prints one JSON line."""

from __future__ import annotations

import json
import resource
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
import torch
from torch.utils.data import DataLoader

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, TrainCrop

BATCH, WORKERS, CHECKED = 256, 2, 3
FLOOR_BATCHES = 60  # of the null dataset: enough for each worker's peak (its prefetched batches in flight)


class NullImages(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """`total` rows, no storage: each a zero 3 x 224 x 224 uint8 image (TrainCrop's output) and label 0."""

    def __init__(self, total: int) -> None:
        self.total = total

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.zeros(3, 224, 224, dtype=torch.uint8), 0


class WorkerRss(threading.Thread):
    """The peak RSS of each child process of this one (the DataLoader workers), and its peak USS (the pages only
    it holds: RSS also counts the pages a forked worker still shares with the main process), sampled every 0.5 s."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop, self.peak, self.unique = threading.Event(), 0, 0

    def run(self) -> None:
        me = psutil.Process()
        while not self.stop.wait(0.5):
            for child in me.children():
                try:
                    mem = child.memory_full_info()
                except psutil.Error:
                    continue
                self.peak, self.unique = max(self.peak, mem.rss), max(self.unique, mem.uss)


def timed_loader(make: Callable[[], DataLoader[Any]], limit: int, keep: Callable[[int], bool]) -> dict[str, Any]:
    """Iterate the loader `make()` builds (its dataset opened inside the timing) for up to `limit` images;
    returns images, img/s, seconds to the first batch, worker peak RSS and the labels of the batches `keep`
    selects."""
    watch = WorkerRss()
    watch.start()
    started, seen, first, kept = time.perf_counter(), 0, 0.0, {}
    for step, (images, labels) in enumerate(make()):
        first = first or time.perf_counter() - started
        if keep(step):
            kept[step] = labels.tolist()
        seen += len(images)
        if seen >= limit:
            break
    wall = time.perf_counter() - started
    watch.stop.set()
    watch.join()
    return {
        "images": seen,
        "rate": seen / wall,
        "first": first,
        "worker_rss_mb": watch.peak / 2**20,
        "worker_uss_mb": watch.unique / 2**20,
        "kept": kept,
    }


def iterable(root: str, state: dict[str, int] | None = None) -> DataLoader[Any]:
    ds = ParquetIterableDataset(root, "train", crop=TrainCrop(224), batch_size=BATCH, seed=0)
    if state is not None:
        ds.load_state_dict(state)
    return DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)


def mapped(root: str) -> DataLoader[Any]:
    ds = ParquetImageDataset(root, "train", crop=TrainCrop(224))
    return DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS, generator=torch.Generator().manual_seed(0)
    )


def null_loader(total: int) -> DataLoader[Any]:
    return DataLoader(
        NullImages(total),
        batch_size=BATCH,
        shuffle=True,
        num_workers=WORKERS,
        generator=torch.Generator().manual_seed(0),
    )


def main() -> None:
    root, map_images = sys.argv[1], int(sys.argv[2])
    total = len(ParquetImageDataset(root, "train", decode=False))
    middle = total // BATCH // 2
    wanted = range(middle, middle + CHECKED)
    epoch = timed_loader(lambda: iterable(root), total, lambda step: step in wanted)
    state = {"epoch": 0, "samples_seen": middle * BATCH}
    resumed = timed_loader(lambda: iterable(root, state), CHECKED * BATCH, lambda step: step < CHECKED)
    equal = [resumed["kept"][k] for k in range(CHECKED)] == [epoch["kept"][middle + k] for k in range(CHECKED)]
    rand = timed_loader(lambda: mapped(root), map_images, lambda step: False)
    floor = timed_loader(lambda: null_loader(total), FLOOR_BATCHES * BATCH, lambda step: False)
    for found in (epoch, resumed, rand, floor):
        found.pop("kept")
    main_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    resume = {**resumed, "equal": equal, "at": middle * BATCH}
    found = {"iter": epoch, "resume": resume, "map": rand, "floor": floor, "main_rss_mb": main_rss, "total": total}
    print(json.dumps(found))


if __name__ == "__main__":
    main()
