"""Issue 33, reader side: a named view (`data/views/<name>/<split>.parquet`, an overlay-shaped file of format 2)
read by every path — map, iterable, RowGroupSampler, the tables helpers, from_dvc, `imagenet_parquet.check` —
with its rows only, labels 0..K-1 in its sorted class order and its classes; a missing view is refused listing
those present; a resume state of another view is refused; and an epoch reads about the view's image bytes, not
its row groups', locally and from an HTTP remote (bytes counted: /proc/self/io, and the server's Range log)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, RowGroupSampler
from imagenet_parquet.check import check, main
from imagenet_parquet.dvcremote import RemoteError
from imagenet_parquet.format import decode_image_index, stored_label_map
from imagenet_parquet.overlay import OverlayError, read_overlay
from imagenet_parquet.tables import curated_sql, read_curated
from tests.helpers.datasets import numbered_label_map
from tests.helpers.images import noisy_jpeg
from tests.helpers.range_files import serving
from tests.helpers.http_remote import publish
from tests.test_reader_appends import samples, sha_rows, write_layer, write_split

CLASSES, ROWS, SHARDS = 20, 300, 3
TENTH = [13, 7]  # the view's classes (2 of 20: ~10 % of the rows), listed unsorted on purpose
UPPER = list(range(10, 20))


def view_map(base: dict[str, Any], picked: list[int]) -> dict[str, Any]:
    """The view's label map: its classes sorted by class id (wnid), labelled 0..K-1."""
    classes = sorted((base["classes"][c] for c in picked), key=lambda c: c["wnid"])
    return {**base, "num_classes": len(classes), "classes": [{**c, "label": i} for i, c in enumerate(classes)]}


@pytest.fixture(scope="module")
def viewed(tmp_path_factory) -> dict[str, Any]:
    """300 images of 20 classes in hashed order over 3 shards of 10-row groups, a curation overlay excluding two,
    and the views `tenth` (classes 7 and 13) and `upper` (10..19) beside them, as the views stage writes them."""
    repo = tmp_path_factory.mktemp("viewed") / "repo"
    root, base = repo / "data" / "parquet", numbered_label_map(CLASSES)
    classes = np.random.default_rng(4).permutation(np.arange(ROWS) % CLASSES)
    items = [(base["classes"][c]["wnid"], noisy_jpeg(i, (128, 96), 85)) for i, c in enumerate(classes)]
    per = ROWS // SHARDS
    files = [write_split(root, f"train-{s:05d}-of-{SHARDS:05d}.parquet", base, items[s * per:(s + 1) * per], 0, 10)
             for s in range(SHARDS)]
    keep = np.ones(ROWS, bool)
    keep[[int(np.flatnonzero(classes == 7)[0]), int(np.flatnonzero(classes == 15)[0])]] = False
    overlay = write_layer(repo / "data" / "overlay" / "train.parquet", files, classes, keep, None)
    digest = read_overlay(overlay)[0]["content_sha256"]
    want = {}
    for name, picked in {"tenth": TENTH, "upper": UPPER}.items():
        vmap = view_map(base, picked)
        wnids = [c["wnid"] for c in vmap["classes"]]
        labels = np.array([wnids.index(base["classes"][c]["wnid"]) if c in picked else -1 for c in classes])
        kept = keep & (labels >= 0)
        extra = {"view": name, "base_overlay_sha256": digest, "spec": json.dumps({"classes": picked})}
        write_layer(repo / "data" / "views" / name / "train.parquet", files, labels, kept, stored_label_map(vmap),
                    extra)
        want[name] = {"map": vmap, "rows": {int(i): int(labels[i]) for i in np.flatnonzero(kept)}}
    return {"repo": repo, "root": root, "files": files, "want": want, "classes": classes}


def kept_bytes(files: list[Path], rows: dict[int, int]) -> int:
    """The image bytes of global rows `rows` (the footers' byte index)."""
    sizes = np.concatenate([decode_image_index(pq.read_metadata(f).metadata, pq.read_metadata(f).num_rows, f)[:, 1]
                            for f in files])
    return int(sizes[sorted(rows)].sum())


def test_a_view_reads_its_rows_with_labels_0_to_k_minus_1_on_every_path(viewed):
    root, want = viewed["root"], viewed["want"]["tenth"]
    rows, wnids = sha_rows(viewed["files"]), [c["wnid"] for c in want["map"]["classes"]]
    ds = ParquetImageDataset(root, "train", decode=False, view="tenth")
    assert wnids == sorted(wnids) and ds.classes == wnids and ds.label_names == ["class 7", "class 13"]
    assert ds.label_map["num_classes"] == 2 and "view tenth" in repr(ds)
    assert samples((ds[i] for i in range(len(ds))), rows) == sorted(want["rows"].items())
    assert ds.targets.tolist() == [want["rows"][i] for i in sorted(want["rows"])]
    sampler = RowGroupSampler(ds, seed=2, view="tenth")
    mapped = samples((ds[i] for i in sampler), rows)
    stream = ParquetIterableDataset(root, "train", decode=False, seed=2, view="tenth")
    assert samples(stream, rows) == mapped and sorted(mapped) == sorted(want["rows"].items())
    table = read_curated(root, "train", columns=["sha256", "label", "wnid", "label_name"], view="tenth")
    pairs = zip(table.column("sha256").to_pylist(), table.column("label").to_pylist(), strict=True)
    assert [(rows[h], y) for h, y in pairs] == sorted(want["rows"].items())
    assert set(table.column("label_name").to_pylist()) == {"class 13", "class 7"}
    sql = duckdb.sql(curated_sql(root, "train", view="tenth"))
    assert [(rows[h], y) for h, y in sql.select("sha256, label").fetchall()] == sorted(want["rows"].items())
    whole = ParquetImageDataset(root, "train", decode=False)  # no view: the whole curated dataset, 20 classes
    assert len(whole) == ROWS - 2 and len(whole.classes) == CLASSES


def test_missing_views_and_views_with_an_overlay_are_refused(viewed):
    root = viewed["root"]
    with pytest.raises(OverlayError, match=r"expected view 'nope'.*found views: tenth, upper"):
        ParquetImageDataset(root, "train", view="nope")
    with pytest.raises(ValueError, match="expected a view name"):
        ParquetIterableDataset(root, "train", view="../overlay")
    with pytest.raises(ValueError, match="view and overlay: expected one of them"):
        ParquetImageDataset(root, "train", view="tenth", overlay=viewed["repo"] / "data" / "overlay" / "train.parquet")
    with pytest.raises(ValueError, match=r"expected the dataset's view \('tenth'"):
        RowGroupSampler(ParquetImageDataset(root, "train", view="tenth"), view="upper")
    other = viewed["repo"] / "data" / "views" / "other" / "train.parquet"
    other.parent.mkdir()
    other.write_bytes((viewed["repo"] / "data" / "views" / "tenth" / "train.parquet").read_bytes())
    try:  # the file of another view under this name
        with pytest.raises(OverlayError, match=r"expected view 'other' \(metadata `view`\), found view 'tenth'"):
            read_curated(root, "train", view="other")
    finally:
        other.unlink()
        other.parent.rmdir()


def test_a_resume_state_of_another_view_is_refused(viewed):
    root = viewed["root"]
    tenth = ParquetIterableDataset(root, "train", decode=False, view="tenth", seed=1)
    upper = ParquetIterableDataset(root, "train", decode=False, view="upper", seed=1)
    whole = RowGroupSampler(ParquetImageDataset(root, "train", decode=False), seed=1)
    state = tenth.state_dict()
    assert state["view"] == "tenth" and state["curation"]
    with pytest.raises(ValueError, match=r"expected view='upper'.*found view='tenth'"):
        upper.load_state_dict({**state, "num_samples": len(upper)})
    with pytest.raises(ValueError, match=r"expected view=None.*found view='tenth'"):
        whole.load_state_dict({**state, "num_samples": len(whole)})
    with pytest.raises(ValueError, match=r"expected view='tenth'.*found view=None"):
        tenth.load_state_dict({**whole.state_dict(), "num_samples": len(tenth)})
    tenth.load_state_dict(state)


def _rchar() -> int:
    return int(next(line for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar"))
               .split()[1])


@pytest.mark.skipif(not Path("/proc/self/io").is_file(), reason="counts bytes read through /proc/self/io (Linux)")
def test_a_local_epoch_reads_about_the_views_bytes(viewed):
    root, rows = viewed["root"], viewed["want"]["tenth"]["rows"]
    stream = ParquetIterableDataset(root, "train", decode=False, view="tenth", seed=3)
    ds = ParquetImageDataset(root, "train", decode=False, view="tenth")
    sampler = RowGroupSampler(ds, seed=3)
    for epoch, read in [(stream, lambda: list(stream)), (ds, lambda: [ds[i] for i in sampler])]:
        before = _rchar()
        assert len(read()) == len(rows)
        ratio = (_rchar() - before) / kept_bytes(viewed["files"], rows)
        assert 1.0 <= ratio <= 1.3, (type(epoch).__name__, ratio)
        print(f"local {type(epoch).__name__}: bytes read / kept image bytes = {ratio:.3f}")


def _range_bytes(log: list[tuple[str, str | None]]) -> int:
    """Bytes the server sent in answer to Range requests (every read the remote reader makes is one)."""
    total = 0
    for _, header in log:
        if header:
            first, _, last = header.removeprefix("bytes=").partition("-")
            total += int(last) - int(first) + 1
    return total


def test_a_remote_view_reads_about_its_bytes_and_check_verifies_it(viewed, tmp_path):
    repo, root, rows = viewed["repo"], viewed["root"], viewed["want"]["tenth"]["rows"]
    publish(repo, tmp_path / "remote", ["data/parquet", "data/overlay", "data/views"])
    assert check(repo, view="tenth") == ([], {"shards": SHARDS, "splits": 1}) and main(["--repo", str(repo),
                                                                                       "--view", "upper"]) == 0
    assert "expected view 'nope'" in check(repo, view="nope")[0][0]
    sha = sha_rows(viewed["files"])
    with serving(tmp_path / "remote") as (url, log):
        def remote(view: str, cls=ParquetIterableDataset, **kw):
            return cls.from_dvc(repo, "data/parquet", split="train", remote=url, view=view, decode=False,
                                cache_dir=tmp_path / "cache", **kw)

        stream = remote("tenth", seed=3)
        log.clear()
        got = samples(stream, sha)
        ratio = _range_bytes(log) / kept_bytes(viewed["files"], rows)
        assert sorted(got) == sorted(rows.items()) and 1.0 <= ratio <= 1.3, ratio
        print(f"remote: bytes fetched / kept image bytes = {ratio:.3f}")
        local = ParquetIterableDataset(root, "train", decode=False, view="tenth", seed=3)
        assert got == samples(local, sha) and stream.classes == local.classes
        again = remote("tenth", seed=3)
        log.clear()
        assert samples(again, sha) == got and _range_bytes(log) == 0  # the second epoch: from the local cache
        ds = remote("upper", ParquetImageDataset)  # half of each row group: whole row groups, as before
        assert samples((ds[i] for i in range(len(ds))), sha) == sorted(viewed["want"]["upper"]["rows"].items())
        with pytest.raises(OverlayError, match=r"expected view 'nope'.*found views: tenth, upper"):
            remote("nope")
        row = min(rows)  # a kept image damaged in the remote: the rows read alone are checked against their sha256
        shard = viewed["files"][row // (ROWS // SHARDS)]
        md5 = hashlib.md5(shard.read_bytes()).hexdigest()
        obj = tmp_path / "remote" / "files" / "md5" / md5[:2] / md5[2:]
        offset = int(decode_image_index(pq.read_metadata(shard).metadata, ROWS // SHARDS, shard)[row % 100][0])
        data = bytearray(obj.read_bytes())
        data[offset + 100] ^= 0xFF
        obj.write_bytes(bytes(data))
        damaged = ParquetImageDataset.from_dvc(repo, "data/parquet", split="train", remote=url, view="tenth",
                                               decode=False, cache_dir=tmp_path / "fresh", retries=0)
        with pytest.raises(RemoteError, match=f"image {row % 100} of {shard.name} does not match its sha256"):
            [damaged[i] for i in range(len(damaged))]
    view = repo / "data" / "views" / "tenth" / "train.parquet"
    good = view.read_bytes()
    view.write_bytes(good[:-1] + b"!")
    try:
        assert any("views/tenth/train.parquet: expected md5" in p for p in check(repo, view="tenth")[0])
    finally:
        view.write_bytes(good)
