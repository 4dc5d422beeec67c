"""Convert uses every core: `workers: auto` is the CPUs available, and each worker asks the kernel for the next
images (posix_fadvise WILLNEED over the manifest's ranges) while it encodes the current one."""
from __future__ import annotations

import os

import pytest

from tasks.convert import sources
from tasks.convert.distribute import run_local
from tasks.convert.plan import order_hash
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
    real_read = sources.read_exact
    monkeypatch.setattr(sources.os, "posix_fadvise", lambda fd, o, n, advice: advice == os.POSIX_FADV_WILLNEED and
                        advised.append((o, n)))
    monkeypatch.setattr(sources, "read_exact", lambda fd, n, o, src: reads.append((o, n, len(advised))) or
                        real_read(fd, n, o, src))
    budget = 5 * max(len(d) for *_, d in images)
    monkeypatch.setattr(sources, "PREFETCH_BYTES", budget)
    job = make_job(tmp_path, workers=1)
    run_local(job, progress=False)
    assert len(read_rows(job)) == 40
    assert sorted(advised) == sorted((o, n) for o, n, _ in reads[1:])  # each image after the first, once
    for index, (offset, size, seen) in enumerate(reads[1:], start=1):
        assert (offset, size) in advised[:seen], index  # asked for before it was read
        ahead = sum(n for o, n in advised[:seen]) - sum(n for _, n, _ in reads[:index])
        assert ahead <= 2 * budget
    assert tar.stat().st_size > 40 * 1000


def test_hashed_order_reads_each_row_group_in_one_forward_sweep_over_the_archive(tmp_path, monkeypatch):
    """A shard in hashed order gathers images from the whole archive: each row group's images are read in
    archive-offset order (one forward sweep), each image once, and the shard holds them in hashed order."""
    images = [(f"n0000000{i % 4}", f"img_{i:03d}.JPEG", noisy_jpeg(i, size=(32, 24))) for i in range(60)]
    flat_dataset(tmp_path, images)
    reads: list[int] = []
    real_read = sources.read_exact
    monkeypatch.setattr(sources, "read_exact", lambda fd, n, o, src: reads.append(o) or real_read(fd, n, o, src))
    job = make_job(tmp_path, workers=1, row_group_rows=8)
    run_local(job, progress=False)
    rows = read_rows(job)
    assert len(rows) == len(reads) == len(set(reads)) == 60
    groups = [reads[k : k + 8] for k in range(0, 60, 8)]
    assert all(g == sorted(g) for g in groups) and reads != sorted(reads)  # sorted inside a group, not across
    names = [r["image"]["path"] for r in rows]
    assert names == sorted(names, key=order_hash) and len({r["wnid"] for r in rows[:8]}) >= 3


@pytest.mark.parametrize("policy", ["passthrough", "reencode"])
def test_the_output_is_the_same_with_prefetch_off(tmp_path, monkeypatch, policy):
    images = [(f"n0000000{i % 3}", f"img_{i:03d}.JPEG", noisy_jpeg(i)) for i in range(12)]
    outputs = []
    for budget in (0, 1 << 20):
        root = tmp_path / f"b{budget}"
        flat_dataset(root, images)
        monkeypatch.setattr(sources, "PREFETCH_BYTES", budget)
        job = make_job(root, policy=policy)
        run_local(job, progress=False)
        outputs.append([r["image"]["bytes"] for r in read_rows(job)])
    assert outputs[0] == outputs[1]
