"""The cheaper forms of convert's per-image and per-run checks decide exactly as the full forms: the entropy-coded
byte count stopped at `enough`, and the manifest's distinct (wnid, label) pairs without Table.group_by."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from tasks.common import PipelineError
from tasks.convert.inputs import _distinct_pairs, check_labels
from tasks.convert.jpeg_header import entropy_coded_bytes, first_scan
from tests.helpers.images import noisy_jpeg


def _agrees(data: bytes, scan: int, enough: int) -> bool:
    full, early = entropy_coded_bytes(data, scan), entropy_coded_bytes(data, scan, enough)
    return min(full, enough) == min(early, enough) and (early >= enough or early == full)


def test_entropy_count_stopped_at_enough_decides_as_the_full_count():
    rng = random.Random(0)
    image = noisy_jpeg(3, size=(64, 48), quality=90)
    scan = first_scan(image)
    assert scan is not None
    padded = image[:scan] + b"\x00" * 40 + b"\xff\xfe\x00\x10" + b"c" * 14 + b"\x00" * 9 + b"\xff\xd0\x01\xff\xd9"
    for data in (image, image[: len(image) // 2], padded):
        full = entropy_coded_bytes(data, scan)
        assert all(_agrees(data, scan, n) for n in {0, 1, 40, 48, 49, 50, full - 1, full, full + 1, 2 * full})
    alphabet = [0xFF, 0x00, 0xD9, 0xD0, 0xFE, 0xC4, 0x10, 0x05]  # markers, stuffing, lengths
    for _ in range(2000):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randrange(60)))
        scan = rng.randrange(5)
        assert all(_agrees(data, scan, n) for n in range(70))


def test_distinct_pairs_are_group_bys_nulls_included():
    table = pa.table({"wnid": pa.array(["b", "a", None, "a", "b", "c", None, "b"], pa.string()),
                      "label": pa.array([1, 0, 2, 0, None, 3, 2, None], pa.int64())})
    as_read = table.set_column(0, "wnid", table.column("wnid").dictionary_encode())  # manifests.read_columns
    rng = random.Random(3)
    wide = pa.table({"wnid": pa.array([rng.choice(["x", "y", "z", None]) for _ in range(500)], pa.string()),
                     "label": pa.array([rng.choice([-(2**62), -1, 0, 7, 2**62, None]) for _ in range(500)], pa.int64())})
    parts = (table, as_read, table.slice(3), table.slice(0, 0), pa.concat_tables([table.slice(1, 3), table.slice(4)]),
             wide)
    for part in parts:
        grouped = part.group_by(["wnid", "label"]).aggregate([]).to_pylist()
        assert sorted(_distinct_pairs(part), key=str) == sorted(((g["wnid"], g["label"]) for g in grouped), key=str)
    with pytest.raises(PipelineError, match=r"m\.parquet: .* found 2 that do not, e\.g\. \[\(.b., 1\), \(None, 2\)\]"):
        check_labels("m.parquet", table.slice(0, 4), {"a": 0, "b": 2})


def test_to_table_builds_what_from_pylist_builds_nulls_included(tmp_path):
    import pyarrow.parquet as pq

    from imagenet_parquet.format import shard_schema
    from imagenet_parquet.writer import to_table, writer_options
    from tests.helpers.datasets import contract_row, numbered_label_map

    schema = shard_schema(numbered_label_map(3), {}, "train")
    rows = [contract_row(noisy_jpeg(i), f"café {i}.JPEG", i % 3, f"n{i:08d}", f"class {i % 3}") for i in range(7)]
    for i, column in enumerate(["wnid", "phash", "label_name", "width", "exif_orientation", "sha256", "label"]):
        rows[i][column] = None
    rows[6]["phash"] = 2**64 - 1
    built, expected = to_table(rows, schema), pa.Table.from_pylist(rows, schema=schema)
    assert built.equals(expected) and built.to_pylist() == rows
    for name, table in (("built", built), ("expected", expected)):
        with pq.ParquetWriter(tmp_path / name, schema, **writer_options()) as writer:
            writer.write_table(table, row_group_size=7)
    assert (tmp_path / "built").read_bytes() == (tmp_path / "expected").read_bytes()
    with pytest.raises(OverflowError):
        to_table([{**rows[0], "exif_orientation": 300}], schema)


def _shard_in_fresh_process(job, plan) -> list[str]:
    import sys

    from tasks.convert.stage import convert_shard

    convert_shard(job, plan)
    return sorted(name for name in ("pandas", "pyarrow.dataset", "pyarrow.acero") if name in sys.modules)


def test_a_convert_worker_loads_neither_pandas_nor_pyarrow_dataset(tmp_path):
    """What a worker loads on first use counts per process (~0.3 s of CPU, ~50 MB RSS for these), not per image."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from tasks.convert.stage import prepare
    from tests.helpers.datasets import flat_dataset, make_job

    flat_dataset(tmp_path, [(f"n0{i % 3}", f"img{i:03d}.JPEG", noisy_jpeg(i)) for i in range(12)])
    job = make_job(tmp_path, row_group_rows=4)
    plans = prepare(job)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert pool.submit(_shard_in_fresh_process, job, plans[0]).result() == []
