"""Extract and plan hold no Python object per image (issue 22, item 3: ImageNet-21k's 13 M images would need
~10 GB at the ~800 B an image they used to hold as dicts, tuples and lists). Python allocations are traced
(tracemalloc; Arrow's own buffers are not Python objects and are not counted): from a small input to one 4x
larger, the peak grows by far less than one small object per added row (batches and one shard's or one class's
rows at a time are a constant)."""
from __future__ import annotations

import tracemalloc

import pyarrow as pa

from tasks.convert.plan import order_rows, plan_split
from tasks.extract import curate
from tasks.extract.folder_scan import scan_folder_split
from tasks.extract.stage import STAGING_SCHEMA

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
    """Bytes of traced Python allocations per added row, from the peak of `run(small)` to that of `run(large)`."""
    run(small)  # caches and lazy imports warmed
    return (_peak(run, large)[1] - _peak(run, small)[1]) / (large - small)


def test_planning_holds_no_python_object_per_row():
    tables = {rows: _manifest(rows) for rows in (ROWS // 4, ROWS)}
    for order in ("hashed", "class"):
        plans = plan_split("train", order_rows(tables[ROWS], order), 256 << 20, "base", order=order)
        assert sum(p.stop - p.start for p in plans) == ROWS and len(plans) > 50
        growth = _growth(lambda n: plan_split("train", order_rows(tables[n], order), 256 << 20, "base", order=order),
                         ROWS // 4, ROWS)
        assert growth < PER_ROW, (order, growth)


def test_curation_touches_only_the_rows_its_lines_name(tmp_path):
    table = _manifest(ROWS).select([f.name for f in STAGING_SCHEMA])
    lines = "split,wnid,name,new_wnid,reason\ntrain,n00000007,n00000007_1007.JPEG,n00000008,moved\n"
    exclude = "split,wnid,name,reason\ntrain,n00000003,n00000003_3.JPEG,blurry\n"
    (tmp_path / "exclude.csv").write_text(exclude)
    (tmp_path / "relabel.csv").write_text(lines)
    cur = curate.read_curation(tmp_path / "exclude.csv", tmp_path / "relabel.csv")
    kept, counts = curate.apply_curation("train", table, cur)
    assert kept.num_rows == ROWS - 1 and counts["exclude"]["by_class"] == {"n00000003": 1}
    moved = kept.filter(pa.compute.equal(kept.column("name"), "n00000007_1007.JPEG")).column("wnid").to_pylist()
    assert moved == ["n00000008"]
    growth = _growth(lambda n: curate.apply_curation("train", table.slice(0, n), cur), ROWS // 4, ROWS)
    assert growth < PER_ROW, growth


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


def test_curation_without_exclusions_keeps_the_table_uncopied():
    table = _manifest(1000).select([f.name for f in STAGING_SCHEMA])
    kept, counts = curate.apply_curation("train", table, curate.Curation())
    assert kept is table and counts["exclude"]["lines"] == 0


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
