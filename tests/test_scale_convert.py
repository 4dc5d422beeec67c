"""Convert uses every core: `workers: auto` is the CPUs available, and each worker asks the kernel for the next
images (posix_fadvise WILLNEED over the manifest's ranges) while it encodes the current one."""
from __future__ import annotations

import os

import pytest

from tasks.convert import stage
from tasks.convert.distribute import run_local
from tests.helpers.datasets import flat_dataset, make_job, read_rows
from tests.helpers.images import noisy_jpeg
from tests.helpers.params import section


def test_workers_auto_is_the_cpus_available():
    cpus = len(os.sched_getaffinity(0))
    assert section("convert", workers="auto").workers == cpus == section("validate", workers="auto").workers
    assert section("convert", workers=3).workers == 3


def test_images_are_asked_of_the_kernel_ahead_of_their_read_once_each_and_in_budget(tmp_path, monkeypatch):
    images = [(f"n0000000{i % 2}", f"img_{i:03d}.JPEG", noisy_jpeg(i, size=(64, 48))) for i in range(40)]
    tar = flat_dataset(tmp_path, images)
    advised: list[tuple[int, int]] = []
    reads: list[tuple[int, int, int]] = []  # (offset, size, advised so far)
    real_read = stage.read_exact
    monkeypatch.setattr(stage.os, "posix_fadvise", lambda fd, o, n, advice: advised.append((o, n)))
    monkeypatch.setattr(stage, "read_exact", lambda fd, n, o, src: reads.append((o, n, len(advised))) or
                        real_read(fd, n, o, src))
    budget = 5 * max(len(d) for *_, d in images)
    monkeypatch.setattr(stage, "PREFETCH_BYTES", budget)
    job = make_job(tmp_path, workers=1)
    run_local(job, progress=False)
    assert len(read_rows(job)) == 40
    assert sorted(advised) == sorted((o, n) for o, n, _ in reads[1:])  # each image after the first, once
    for index, (offset, size, seen) in enumerate(reads[1:], start=1):
        assert (offset, size) in advised[:seen], index  # asked for before it was read
        ahead = sum(n for o, n in advised[:seen]) - sum(n for _, n, _ in reads[:index])
        assert ahead <= 2 * budget
    assert tar.stat().st_size > 40 * 1000


@pytest.mark.parametrize("policy", ["passthrough", "reencode"])
def test_the_output_is_the_same_with_prefetch_off(tmp_path, monkeypatch, policy):
    images = [(f"n0000000{i % 3}", f"img_{i:03d}.JPEG", noisy_jpeg(i)) for i in range(12)]
    outputs = []
    for budget in (0, 1 << 20):
        root = tmp_path / f"b{budget}"
        flat_dataset(root, images)
        monkeypatch.setattr(stage, "PREFETCH_BYTES", budget)
        job = make_job(root, policy=policy)
        run_local(job, progress=False)
        outputs.append([r["image"]["bytes"] for r in read_rows(job)])
    assert outputs[0] == outputs[1]
