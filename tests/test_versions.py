"""Versions that cost what changed (issue 12): the content-defined shard layout keeps shards (names, keys) whose
rows did not change; a curation edit rerun through `dvc repro` (curate: the overlay, no shard rewritten) reports
"changes since the previous version" (versions/index.json, `dvc metrics diff`), and `dvc push` / `dvc pull` move
the overlay and reports only — to and from a local remote and moto's S3 server on 127.0.0.1."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.convert.plan import content_ranges, order_rows, plan_split, row_key
from tests.helpers.params import write_params
from tests.helpers.project import GIT, copy_project, up_to_date
from tests.test_remote import S3_ENV, _configure, _run, moto_s3  # noqa: F401  (moto_s3: a fixture)


def _manifest(n: int, classes: int = 20, seed: int = 0) -> pa.Table:
    rows = sorted((f"n{c:08d}", f"n{c:08d}_{i:05d}.JPEG", 9000 + (i * 7919 + c * 104729 + seed) % 50000)
                  for i in range(n // classes) for c in range(classes))
    return pa.Table.from_pylist([{"label": int(w[1:]), "wnid": w, "name": name, "source": "s", "member": "",
                                  "offset": 0, "size": size} for w, name, size in rows])


def _shards(table: pa.Table, layout: str = "content", order: str = "class") -> dict[str, str]:
    return {p.name: p.key for p in plan_split("train", order_rows(table, order), TARGET, "base", layout, order)}


TARGET = 8 << 20  # ~250 images of ~33 KB a shard (ImageNet at 256 MB: ~2300)


def _changed(before: dict[str, str], after: dict[str, str]) -> int:
    return sum(before.get(name) != key for name, key in after.items())


def test_content_layout_rewrites_only_the_shards_holding_a_change_size_layout_shifts_all():
    table = _manifest(20000)  # ~680 MB of input
    base, old = _shards(table), _shards(table, "size")
    assert 60 < len(base) < 140 and all(not n.split("-", 1)[1].startswith("0") for n in base)
    sizes = [p.input_bytes for p in plan_split("train", table, TARGET, "base")]
    assert max(sizes) <= 2 * TARGET and min(sizes[:-1]) >= TARGET // 2  # MIN..MAX around the target
    for drop in (1, 1000, 2500, 9999, 15000, 19998):  # remove one image
        smaller = pa.concat_tables([table.slice(0, drop), table.slice(drop + 1)])
        assert _changed(base, _shards(smaller)) == 1
        if drop == 1:
            assert _changed(old, _shards(smaller, "size")) > len(old) // 4  # the former layout: many shards
    wnids = table.column("wnid").to_pylist()
    relabelled = _relabel(table, lambda i, w: w == "n00000003" and not i % 3, "n00000017")  # relabel a third
    touched = {n for n in base if n.startswith(("train-n00000003", "train-n00000017"))}
    assert _changed(base, _shards(relabelled)) <= len(touched) + 2
    assert content_ranges(map(row_key, wnids, wnids), [1] * len(wnids), TARGET) == [(0, len(wnids), len(wnids))]
    assert plan_split("val", table.slice(0, 0), TARGET, "base")[0].name == "val-empty.parquet"


def _relabel(table: pa.Table, pick, to: str) -> pa.Table:
    wnids = table.column("wnid").to_pylist()
    moved = [to if pick(i, w) else w for i, w in enumerate(wnids)]
    return table.set_column(1, "wnid", pa.array(moved)).sort_by([("wnid", "ascending"), ("name", "ascending")])


def test_hashed_order_one_removal_or_relabel_rewrites_one_shard_a_new_class_most():
    table = _manifest(20000)
    base = _shards(table, order="hashed")
    assert 60 < len(base) < 140 and all(n.startswith("train-h") for n in base)
    plans = plan_split("train", order_rows(table, "hashed"), TARGET, "base", order="hashed")
    sizes = [p.input_bytes for p in plans]
    assert max(sizes) <= 2 * TARGET and min(sizes[:-1]) >= TARGET // 2
    hashed = order_rows(table, "hashed")
    first = hashed.slice(plans[1].start, plans[1].stop - plans[1].start).column("wnid").to_pylist()
    assert len(set(first)) == 20  # every shard a uniform sample of the classes (~250 rows of 20)
    for drop in (1, 2500, 9999, 19998):  # remove one image: one shard
        assert _changed(base, _shards(pa.concat_tables([table.slice(0, drop), table.slice(drop + 1)]), order="hashed")) == 1
    for row in (0, 777, 12345):  # relabel one image: one shard (the class-order layout rewrites two)
        one = _relabel(table, lambda i, w, row=row: i == row, "n00000017")
        assert _changed(base, _shards(one, order="hashed")) == 1
        assert _changed(_shards(table), _shards(one)) == 2
    extra = pa.Table.from_pylist([{"label": 20, "wnid": "n00000020", "name": f"n00000020_{i:05d}.JPEG", "source": "s",
                                   "member": "", "offset": 0, "size": 20000} for i in range(1000)])
    added = pa.concat_tables([table, extra])
    assert _changed(base, _shards(added, order="hashed")) > 0.8 * len(base)  # a new class: most shards
    assert _changed(_shards(table), _shards(added)) <= 6  # class order: its own ~3 new shards + the one before


@pytest.fixture(scope="module")
def versioned(tmp_path_factory, prefect_api):
    """v1: `dvc repro` on the sample with small shards, committed and pushed to a local remote; a node pulled it."""
    tmp = tmp_path_factory.mktemp("versions")
    repo = copy_project(tmp / "project")
    write_params(repo, convert={"shard_mb": 0.4})  # ~16 images a shard: a cut resynchronises within a shard or two
    _run(["dvc", "repro"], repo)
    _commit(repo, "v1")
    _configure(repo, "local", str(tmp / "remote"))
    _run(["dvc", "push"], repo)
    node = tmp / "node"
    _run(["git", "clone", "-q", str(repo), str(node)], tmp)
    _run(["dvc", "pull", "data/parquet"], node)
    return repo, node, tmp / "remote"


def _commit(repo: Path, message: str) -> None:
    _run(["git", "add", "-A"], repo)
    _run([*GIT, "commit", "-qm", message, "--allow-empty"], repo)


def _objects(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_curation_edit_reports_the_change_and_moves_no_shard(versioned, tmp_path, moto_s3):
    """Merge-on-read (issue 27): a curation edit reruns curate and validate only — the shards keep their bytes,
    the report and `dvc metrics diff` count the image removed with 0 shards rewritten, and `dvc push` / `dvc pull`
    move the small overlay and reports, no shard."""
    repo, node, remote = versioned
    endpoint, s3 = moto_s3
    shards_v1 = {p.name: p.read_bytes() for p in sorted((repo / "data/parquet/train").glob("*.parquet"))}
    assert len(shards_v1) >= 4 and not any("-of-" in n for n in shards_v1)
    middle = sorted(shards_v1)[len(shards_v1) // 2]
    names = pq.read_table(repo / "data/parquet/train" / middle, columns=["image", "wnid"]).to_pylist()
    victim = {"wnid": names[len(names) // 2]["wnid"], "name": names[len(names) // 2]["image"]["path"]}
    (repo / "curation/exclude.csv").write_text(
        f"split,wnid,name,reason\ntrain,{victim['wnid']},{victim['name']},near-duplicate of val\n")
    status = _run(["dvc", "status"], repo)
    assert "curate" in status and "extract" not in status and "convert:" not in status
    _run(["dvc", "repro"], repo)

    shards_v2 = {p.name: p.read_bytes() for p in sorted((repo / "data/parquet/train").glob("*.parquet"))}
    assert shards_v2 == shards_v1  # no shard rewritten: the overlay holds the exclusion
    report = (repo / "data/reports/schema_report.md").read_text()
    assert "## Changes since the previous version" in report and "## Curation applied" in report
    assert f"**train**: 0 of {len(shards_v2)} shards rewritten (none); 0 removed." in report
    assert f"| {victim['wnid']} | 20 | 19 | 0 | 1 | 0 | 0 |" in report and "**val**: 0 of" in report
    assert "| exclude | train | near-duplicate of val | 1 |" in report
    changes = json.loads((repo / "versions/changes.json").read_text())
    assert changes["train"]["images_removed"] == 1 and changes["train"]["shards_rewritten"] == 0
    assert changes["val"] == {**changes["val"], "shards_rewritten": 0, "images_removed": 0}
    diff = json.loads(_run(["dvc", "metrics", "diff", "--json"], repo))
    assert diff["versions/changes.json"]["train.images_removed"]["new"] == 1
    _commit(repo, "v2: one train image excluded")
    assert up_to_date(_run(["dvc", "status"], repo))

    sizes = {len(data) for data in shards_v2.values()}
    before = _objects(remote)
    _run(["dvc", "push"], repo)
    pushed = {k: v for k, v in _objects(remote).items() if k not in before}
    assert pushed and not sizes & set(pushed.values()) and sum(pushed.values()) <= 4 << 20
    cache = node / ".dvc/cache"
    held = _objects(cache)
    _run(["git", "pull", "-q", "--no-rebase"], node)
    _run(["dvc", "pull", "data/parquet", "data/overlay"], node)
    pulled = {k: v for k, v in _objects(cache).items() if k not in held}
    assert pulled and not sizes & set(pulled.values())
    assert {p.name: p.read_bytes() for p in sorted((node / "data/parquet/train").glob("*.parquet"))} == shards_v2
    assert (node / "data/overlay/train.parquet").read_bytes() == (repo / "data/overlay/train.parquet").read_bytes()

    # S3 (moto): v1 pushed, then v2 adds no shard
    _run([*GIT, "checkout", "-q", "HEAD~1"], repo)
    _run(["dvc", "checkout"], repo)
    _configure_s3 = ["bash", "scripts/remote.sh", "s3", "s3://training-data/imagenet", endpoint]
    _run(_configure_s3, repo)
    _run(["dvc", "push"], repo, S3_ENV)
    keys = _s3_objects(s3)
    _run(["git", "checkout", "-q", "-f", "-"], repo)
    _run(["dvc", "checkout"], repo)
    _run(_configure_s3, repo)
    _run(["dvc", "push"], repo, S3_ENV)
    added = {k: v for k, v in _s3_objects(s3).items() if k not in keys}
    assert added and not sizes & set(added.values()) and sum(added.values()) <= 4 << 20


def _s3_objects(s3) -> dict[str, int]:
    return {o["Key"]: o["Size"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket="training-data")
            for o in page.get("Contents", [])}
