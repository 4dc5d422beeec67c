"""Appends land in new shards (issue 33, tasks/convert/history.py): images new to a split since the previous convert —
in existing classes, of a new class that sorts first (ImageFolder's labels shift), a modified image — go into new
shards of generation 1; every earlier shard keeps its name and bytes; a removed image rewrites nothing; a quarantined
image is not retried; the same history and source give the same bytes with any worker count; without the history
(`make relayout`) the result is a fresh convert's."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from imagenet_parquet.format import label_map_from_metadata, shard_generation
from tasks.common import PipelineError
from tasks.convert.distribute import run_local
from tests.helpers.datasets import flat_dataset, make_job, shard_bytes
from tests.helpers.images import noisy_jpeg

PARAMS = {"shard_mb": 0.05, "row_group_rows": 4}


def _v0() -> list[tuple[str, str, bytes]]:
    images = [(f"n0{1 + i % 3}", f"img{i:03d}.JPEG", noisy_jpeg(i)) for i in range(45)]
    return [*images, ("n02", "zero.JPEG", b"")]  # quarantined: never a row


def _v1() -> list[tuple[str, str, bytes]]:
    images = [i for i in _v0() if i[1] != "img002.JPEG"]  # removed from the source (class n03)
    images = [(w, n, noisy_jpeg(999, size=(80, 64)) if n == "img003.JPEG" else d) for w, n, d in images]  # modified
    images += [("n02", f"more{i}.JPEG", noisy_jpeg(100 + i)) for i in range(5)]
    return images + [("n00", f"ant{i}.JPEG", noisy_jpeg(200 + i)) for i in range(6)]  # a class sorting first


def _md5s(root: Path) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted((root / "data/parquet").rglob("*.parquet"))}


def _convert(root: Path, images: list[tuple[str, str, bytes]], workers: int = 1) -> dict:
    flat_dataset(root, images)
    return run_local(make_job(root, **PARAMS), workers=workers, progress=False)


def test_an_append_round_writes_only_new_shards_of_generation_1(tmp_path):
    root = tmp_path / "a"
    _convert(root, _v0())
    before = _md5s(root)
    metrics = _convert(root, _v1())
    after = _md5s(root)
    assert {n: after.get(n) for n in before} == before  # every earlier shard: same name, same bytes
    new = sorted(set(after) - set(before))
    assert new and all(n.startswith("train-g1-") for n in new)
    rows = [r for n in new for r in pq.read_table(root / "data/parquet/train" / n).to_pylist()]
    assert sorted((r["wnid"], r["image"]["path"]) for r in rows) == sorted(
        [("n01", "img003.JPEG")] + [("n02", f"more{i}.JPEG") for i in range(5)] + [("n00", f"ant{i}.JPEG") for i in range(6)])
    for name in new:
        meta = pq.read_schema(root / "data/parquet/train" / name).metadata
        assert shard_generation(meta) == 1 and label_map_from_metadata(meta, name)["classes"][0]["wnid"] == "n00"
    assert all(r["label"] == ["n00", "n01", "n02", "n03"].index(r["wnid"]) for r in rows)  # the new label map
    layout = json.loads((root / "versions/layout.json").read_text())
    gens = layout["splits"]["train"]
    assert [g["generation"] for g in gens] == [0, 1] and {s["name"] for s in gens[1]["shards"]} == set(new)
    assert [b["record"]["name"] for g in gens for b in g["bad"]] == ["zero.JPEG"]  # quarantined once, not retried
    assert len((root / "data/parquet/bad_images.jsonl").read_text().splitlines()) == 1
    assert metrics["splits"]["train"]["rows"] == 45 + 12 and metrics["splits"]["train"]["appended_rows"] == 12
    history, shards = (root / "versions/layout.json").read_bytes(), shard_bytes(make_job(root, **PARAMS))
    assert run_local(make_job(root, **PARAMS), progress=False)["splits"] == metrics["splits"]  # a no-op rerun
    assert (root / "versions/layout.json").read_bytes() == history and shard_bytes(make_job(root)) == shards


def test_the_same_history_and_source_give_the_same_bytes_and_relayout_gives_a_fresh_convert(tmp_path):
    a, b, fresh = tmp_path / "a", tmp_path / "b", tmp_path / "fresh"
    _convert(a, _v0())
    shutil.copytree(a / "data/parquet", b / "data/parquet")  # another clone: `dvc pull` of v0 and its history
    shutil.copytree(a / "versions", b / "versions")
    _convert(a, _v1(), workers=1)
    _convert(b, _v1(), workers=2)
    assert shard_bytes(make_job(a)) == shard_bytes(make_job(b))
    assert (a / "versions/layout.json").read_bytes() == (b / "versions/layout.json").read_bytes()
    (b / "versions/layout.json").unlink()  # make relayout
    run_local(make_job(b, **PARAMS), progress=False)
    _convert(fresh, _v1())
    assert shard_bytes(make_job(b)) == shard_bytes(make_job(fresh)) and _md5s(b) == _md5s(fresh)
    assert (b / "versions/layout.json").read_bytes() == (fresh / "versions/layout.json").read_bytes()
    assert not any("-g1-" in n for n in _md5s(b))


def test_a_missing_appended_shard_is_refused_a_canonical_history_is_rewritten_and_new_params_start_again(tmp_path):
    root = tmp_path / "a"
    _convert(root, _v0())
    canonical = shard_bytes(make_job(root))
    shutil.rmtree(root / "data/parquet")  # history of generation 0 only: what a convert writes again
    _convert(root, _v0())
    assert shard_bytes(make_job(root)) == canonical
    _convert(root, _v1())
    appended = sorted((root / "data/parquet/train").glob("train-g1-*.parquet"))
    appended[0].rename(tmp_path / "aside")  # deleted as DVC deletes the directory: linked back from data/scratch
    run_local(make_job(root, **PARAMS), progress=False)
    assert appended[0].samefile(tmp_path / "aside") and not list(root.glob("data/parquet/*/*-g2-*"))
    appended[0].unlink()
    assert not (root / "data/scratch/convert/train" / appended[0].name).exists()  # an earlier run's: dropped
    with pytest.raises(PipelineError, match=r"expected the shard of generation 1 .*dvc pull.*make relayout"):
        run_local(make_job(root, **PARAMS), progress=False)
    (tmp_path / "aside").rename(appended[0])
    run_local(make_job(root, **{**PARAMS, "shard_mb": 0.04}), progress=False)  # another output param: canonical
    layout = json.loads((root / "versions/layout.json").read_text())
    assert len(layout["splits"]["train"]) == 1 and not list(root.glob("data/parquet/*/*-g1-*"))
    (root / "versions/layout.json").write_text("{not json")
    with pytest.raises(PipelineError, match=r"layout.json: expected the layout history .*make relayout"):
        run_local(make_job(root, **PARAMS), progress=False)


def test_an_append_killed_before_its_history_is_written_resumes_to_the_same_bytes(tmp_path):
    from tasks.convert.stage import convert_shard, prepare

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    for root in (whole, killed):
        _convert(root, _v0())
    _convert(whole, _v1())
    flat_dataset(killed, _v1())
    job = make_job(killed, **PARAMS)
    plans = prepare(job)
    assert len(plans) >= 2 and all(p.generation == 1 for p in plans)
    convert_shard(job, plans[0])  # killed after one appended shard: no history entry for it yet
    metrics = run_local(job, progress=False)
    assert metrics["resumed_shards"] == 1 and shard_bytes(job) == shard_bytes(make_job(whole))
    assert (killed / "versions/layout.json").read_bytes() == (whole / "versions/layout.json").read_bytes()
