"""Extract, plan and curate hold no Python object per image (issue 22, item 3: ImageNet-21k's 13 M images would need
~10 GB at the ~800 B an image they used to hold as dicts, tuples and lists). Python allocations are traced
(tracemalloc; Arrow's own buffers are not Python objects and are not counted): from a small input to one 4x
larger, the peak grows by far less than one small object per added row (batches and one shard's or one class's
rows at a time are a constant); the curate stage's per-row numpy arrays (labels, keep flags) are counted exactly."""
from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from imagenet_parquet.format import IMAGE_TYPE, class_ids, shard_schema
from tasks.convert.plan import order_rows, plan_split
from tasks.curate import lines as curate
from tasks.curate import stage
from tasks.extract.folder_scan import scan_folder_split
from tasks.extract.stage import STAGING_SCHEMA
from tests.helpers.datasets import numbered_label_map

ROWS = 280_000  # ROWS // 4 > 65,536 (plan.BATCH): both sizes hold a full batch of names
PER_ROW = 8  # bytes of Python objects per added row at most (a str alone is ~60 B; the old code held ~800 B)


def _peak(fn, *args):
    tracemalloc.start()
    try:
        result = fn(*args)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _manifest(rows: int) -> pa.Table:
    return pa.table({
        "label": pa.array([i % 1000 for i in range(rows)], pa.int64()),
        "wnid": pa.array([f"n{i % 1000:08d}" for i in range(rows)]),
        "name": pa.array([f"n{i % 1000:08d}_{i}.JPEG" for i in range(rows)]),
        "source": pa.array(["train.tar"] * rows),
        "member": pa.array([f"n{i % 1000:08d}.tar" for i in range(rows)]),
        "offset": pa.array(range(rows), pa.int64()),
        "size": pa.array([100_000 + i % 7919 for i in range(rows)], pa.int64()),
    })


def _growth(run, small: int, large: int) -> float:
    """Bytes of traced Python allocations per added row, from the peak of `run(small)` to that of `run(large)`.
    tracemalloc counts every thread's allocations, the test runner's too (xdist's IO thread receiving the next tests:
    a few KB, enough to pass 8 B/row at 15,000 rows): each peak is the lower of two runs."""
    run(small)  # caches and lazy imports warmed
    return (_low_peak(run, large) - _low_peak(run, small)) / (large - small)


def _low_peak(run, rows: int) -> int:
    return min(_peak(run, rows)[1] for _ in range(2))


def test_planning_holds_no_python_object_per_row():
    tables = {rows: _manifest(rows) for rows in (ROWS // 4, ROWS)}
    for order in ("hashed", "class"):
        plans = plan_split("train", order_rows(tables[ROWS], order), 256 << 20, "base", order=order)
        assert sum(p.stop - p.start for p in plans) == ROWS and len(plans) > 50
        growth = _growth(lambda n: plan_split("train", order_rows(tables[n], order), 256 << 20, "base", order=order),
                         ROWS // 4, ROWS)
        assert growth < PER_ROW, (order, growth)


LABEL_MAP = numbered_label_map(1000)
IDS = class_ids(LABEL_MAP)


def _split_rows(rows: int) -> stage.SplitRows:
    """A split of `rows` images over 1000 classes as the curate stage reads it (names as Arrow, labels numpy)."""
    names = pa.array([f"{IDS[i % 1000]}_{i}.JPEG" for i in range(rows)])
    return stage.SplitRows([("train-0.parquet", rows, "0" * 64)], names, np.arange(rows, dtype=np.int64) % 1000)


def _lines(root) -> curate.Curation:
    (root / "exclude.csv").write_text(f"split,wnid,name,reason\ntrain,{IDS[3]},{IDS[3]}_3.JPEG,blurry\n")
    moved = f"train,{IDS[7]},{IDS[7]}_1007.JPEG,{IDS[8]},moved\n"
    (root / "relabel.csv").write_text(f"split,wnid,name,new_wnid,reason\n{moved}")
    return curate.read_curation(root / "exclude.csv", root / "relabel.csv")


def test_curation_touches_only_the_rows_its_lines_name(tmp_path):
    """apply_lines: the labels and keep flags it returns (8 + 1 B a row, numpy) and no Python object per row."""
    rows = {n: _split_rows(n) for n in (ROWS // 4, ROWS)}
    cur = _lines(tmp_path)
    labels, keep, missing = stage.apply_lines("train", rows[ROWS], IDS, cur, tmp_path / "no-manifests")
    assert int((~keep).sum()) == 1 and not keep[3] and labels[1007] == 8 and not missing
    assert int((labels != rows[ROWS].labels).sum()) == 1
    growth = _growth(lambda n: stage.apply_lines("train", rows[n], IDS, cur, tmp_path), ROWS // 4, ROWS)
    assert growth < 9 + 1, growth


def _converted(root, rows: int) -> stage.CurateJob:
    """Shards as the curate stage reads them (`image.path` and `label`; empty image bytes), train `rows` images and
    val a tenth of that, the label map and the lines of _lines."""
    root.mkdir()
    (root / "label_map.json").write_text(json.dumps(LABEL_MAP))
    for split, count in (("train", rows), ("val", rows // 10)):
        schema = shard_schema(LABEL_MAP, {}, split, curation="overlay")
        names = pa.array([f"{IDS[i % 1000]}_{i}.JPEG" for i in range(count)])
        columns = {f.name: pa.nulls(count, f.type) for f in schema}
        columns["image"] = pa.StructArray.from_arrays([pa.array([b""] * count, pa.binary()), names],
                                                      fields=list(IMAGE_TYPE))
        columns["label"] = pa.array(np.arange(count, dtype=np.int64) % 1000)
        (root / "parquet" / split).mkdir(parents=True)
        pq.write_table(pa.Table.from_arrays(list(columns.values()), schema=schema),
                       root / "parquet" / split / f"{split}-0.parquet", row_group_size=1 << 16)
    return stage.CurateJob(root / "parquet", root / "manifests", root / "label_map.json", root / "overlay",
                           _lines(root))


def test_the_curate_stage_holds_numpy_columns_not_an_object_per_row(tmp_path):
    """write_overlays over both splits: per row only numpy columns — the labels as read and with the lines (8 + 8
    B), the keep flags (1), the overlay's row and shard columns (~16) —, never a Python object (a str is ~60 B)."""
    jobs = {n: _converted(tmp_path / str(n), n) for n in (ROWS // 4, ROWS)}
    report = stage.write_overlays(jobs[ROWS])
    assert [len(report[k]["train"]["by_class"]) for k in ("exclude", "relabel")] == [1, 1]
    assert pq.read_metadata(jobs[ROWS].overlay / "train.parquet").num_rows == ROWS
    growth = _growth(lambda n: stage.write_overlays(jobs[n]), ROWS // 4, ROWS) / 1.1  # val: a tenth more rows
    assert growth < 40, growth


def _tree(root, classes: int, per_class: int = 200):
    for c in range(classes):
        folder = root / "train" / f"n{c:08d}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            (folder / f"n{c:08d}_{i}.JPEG").write_bytes(b"\xff\xd8")
    return root


def test_the_folder_scan_keeps_arrow_columns_not_a_dict_per_image(tmp_path):
    # 500 images a class: a class's few objects (its Arrow table, its list entry) are not counted as a row's
    trees = {n: _tree(tmp_path / str(n), n // 500, 500) for n in (5_000, 20_000)}
    table, reported = scan_folder_split(trees[20_000], "train", trees[20_000], STAGING_SCHEMA)
    assert table.num_rows == 20_000 and not reported
    assert table.column("source")[0].as_py() == "train/n00000000/n00000000_0.JPEG"
    growth = _growth(lambda n: scan_folder_split(trees[n], "train", trees[n], STAGING_SCHEMA), 5_000, 20_000)
    assert growth < PER_ROW, growth  # one class of dicts at a time


def test_curation_without_lines_reads_no_manifest_and_keeps_every_label(tmp_path):
    rows = _split_rows(1000)
    labels, keep, missing = stage.apply_lines("train", rows, IDS, curate.Curation(), tmp_path / "no-such-dir")
    assert np.array_equal(labels, rows.labels) and keep.all() and missing == []


def _arrow_peak(run) -> int:
    """Peak bytes Arrow allocated while `run()` ran, above what was allocated before (a pool of its own)."""
    pool = pa.proxy_memory_pool(pa.default_memory_pool())
    before, previous = pool.bytes_allocated(), pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        run()
    finally:
        pa.set_memory_pool(previous)
    return pool.max_memory() - before


def test_planning_and_the_manifest_writer_never_copy_the_manifest(tmp_path, monkeypatch):
    """The planner keeps one copy of the manifest (the hashed order is a view: 24 + 8 B per row, not a second
    table); the manifest writer sorts into row groups, never a second whole table (13 M rows: ~1 GB each)."""
    from tasks.common.manifests import read_columns
    from tasks.convert.plan import ordered
    from tasks.extract import write

    table = _manifest(ROWS)
    extra = _arrow_peak(lambda: plan_split("train", ordered(table, "hashed"), 256 << 20, "base", order="hashed"))
    assert extra < 0.5 * table.nbytes, (extra, table.nbytes)  # a copy of the table would be 1.0 x
    staging = table.select([f.name for f in STAGING_SCHEMA])
    label_of = {f"n{c:08d}": c for c in range(1000)}
    path = tmp_path / "staging.parquet"
    pa.parquet.write_table(staging, path)
    read = read_columns(path, staging.column_names, ["wnid", "source", "member"])
    assert read.to_pylist()[:3] == staging.to_pylist()[:3] and read.num_rows == ROWS
    monkeypatch.setattr(write, "ROW_GROUP", 1 << 15)  # rows at a time: a whole copy would be 280,000
    extra = _arrow_peak(lambda: write.write_manifests(tmp_path, {"train": read, "val": read.slice(0, 0)}, label_of))
    assert extra < 0.75 * staging.nbytes, (extra, staging.nbytes)
    manifest = pa.parquet.read_table(tmp_path / "train.parquet")
    names = sorted(staging.column("name").to_pylist(), key=lambda n: (n[:9], n))  # by class, then name
    assert manifest.num_rows == ROWS and manifest.column("name").to_pylist() == names
    assert pa.parquet.read_metadata(tmp_path / "train.parquet").num_row_groups == -(-ROWS // (1 << 15))
