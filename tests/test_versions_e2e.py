"""Issue 33 end to end, through `dvc repro` in folder mode: a round of appends (images in an existing class and a new
class whose name sorts first, shifting ImageFolder's labels), a removal from the source and a relabel writes only new
shards of generation 1 — every earlier shard keeps its bytes — and every reader path (map, iterable,
RowGroupSampler, the tables helper, `imagenet_parquet.check`, a view by name) sees exactly the labels torchvision's
ImageFolder gives the new tree, with the relabel applied; a resume state of the previous version or of another view
is refused."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, RowGroupSampler
from imagenet_parquet.format import shard_generation
from imagenet_parquet.tables import read_curated
from tests.helpers.datasets import small_jpeg
from tests.helpers.docs import readme_params
from tests.helpers.params import write_params
from tests.helpers.project import GIT, cached_file, copy_project, up_to_date
from tests.test_classes import imagefolder_labels
from tests.test_remote import _run


def _image(tree: Path, split: str, folder: str, name: str, seed: int) -> None:
    (tree / split / folder).mkdir(parents=True, exist_ok=True)
    (tree / split / folder / name).write_bytes(small_jpeg(seed))


def _tree(tree: Path) -> None:
    for c, folder in enumerate(["bird", "cat", "dog"]):
        for i in range(5):
            _image(tree, "train", folder, f"{folder}_{i}.jpg", 100 * c + i)
        for i in range(2):
            _image(tree, "val", folder, f"{folder}_v{i}.jpg", 100 * c + 50 + i)


def _md5s(root: Path) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(root.glob("*/*.parquet"))}


def _expected(tree: Path, split: str, relabel: dict[str, str]) -> dict[str, int]:
    """file -> label: ImageFolder's rule on the tree, then the relabels (file -> folder)."""
    reference = imagefolder_labels(tree / split)
    classes = sorted({folder for folder, _ in reference})
    return {file: classes.index(relabel[file]) if file in relabel else label for (_, file), label in reference.items()}


def _by_file(tree: Path, split: str) -> dict[bytes, str]:
    return {p.read_bytes(): p.name for p in sorted((tree / split).glob("*/*"))}


def _inodes(root: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in sorted(root.glob("*/*.parquet"))}


def _commit(repo: Path, message: str) -> None:
    _run(["git", "add", "-A"], repo)
    _run([*GIT, "commit", "-qm", message], repo)


@pytest.fixture(scope="module")
def appended(tmp_path_factory, prefect_api):
    """v0 converted and committed; then +3 images of a new class `ant` (sorts first), +2 images of `cat`, one `dog`
    image deleted from the source, one `cat` image relabelled to `dog`: `dvc repro` again."""
    tmp = tmp_path_factory.mktemp("appends")
    tree, repo = tmp / "tree", copy_project(tmp / "project")
    _tree(tree)
    write_params(repo, extract=readme_params("own-imagenet100", extract__folder=str(tree))["extract"],
                 views={"pets": {"classes": ["cat", "dog"]}})
    _run(["dvc", "repro"], repo)
    _commit(repo, "v0")
    before = _md5s(repo / "data/parquet")
    inodes = _inodes(repo / "data/parquet")
    state = ParquetIterableDataset(repo / "data/parquet", "train", decode=False).state_dict()
    for i in range(3):
        _image(tree, "train", "ant", f"ant_{i}.jpg", 900 + i)
    _image(tree, "val", "ant", "ant_v0.jpg", 950)
    for i in range(5, 7):
        _image(tree, "train", "cat", f"cat_{i}.jpg", 110 + i)
    (tree / "train/dog/dog_3.jpg").unlink()
    (repo / "curation/relabel.csv").write_text("split,wnid,name,new_wnid,reason\ntrain,cat,cat_1.jpg,dog,a dog\n")
    _run(["dvc", "repro"], repo)
    return tree, repo, before, state, inodes


def test_an_append_round_writes_only_new_shards_and_dvc_is_up_to_date(appended):
    tree, repo, before, _, inodes = appended
    after = _md5s(repo / "data/parquet")
    assert {n: after.get(n) for n in before} == before  # every earlier shard: same name, same bytes
    new = sorted(set(after) - set(before))
    assert new and all("-g1-" in n for n in new), new
    for name in new:
        split = name.split("-", 1)[0]
        assert shard_generation(pq.read_schema(repo / "data/parquet" / split / name).metadata) == 1
    layout = json.loads((repo / "versions/layout.json").read_text())
    assert [g["generation"] for g in layout["splits"]["train"]] == [0, 1]
    changes = json.loads((repo / "versions/changes.json").read_text())["train"]
    assert changes["shards_rewritten"] == 0
    assert (changes["images_added"], changes["images_removed"]) == (5, 1), changes
    assert up_to_date(_run(["dvc", "status"], repo))
    # DVC deleted the directory (not `persist`: no copy of every shard first); convert linked the earlier shards back
    # from the DVC cache: the same inodes, and every shard is one copy on disk with its cache file
    assert {n: i for n, i in _inodes(repo / "data/parquet").items() if n in inodes} == inodes
    assert all(p.samefile(cached_file(repo, p)) for p in sorted((repo / "data/parquet").glob("*/*.parquet")))


@pytest.mark.parametrize("split", ["train", "val"])
def test_every_reader_path_gives_imagefolder_labels_of_the_new_tree(appended, split):
    tree, repo, _, _, _ = appended
    relabel = {"cat_1.jpg": "dog"} if split == "train" else {}
    expected, files = _expected(tree, split, relabel), _by_file(tree, split)
    parquet = repo / "data/parquet"
    ds = ParquetImageDataset(parquet, split, decode=False)
    assert ds.classes == ["ant", "bird", "cat", "dog"]
    assert {files[data]: label for data, label in (ds[i] for i in range(len(ds)))} == expected
    sampler = RowGroupSampler(ds, seed=3)
    assert sorted({files[ds[i][0]]: ds[i][1] for i in sampler}.items()) == sorted(expected.items())
    iterable = ParquetIterableDataset(parquet, split, decode=False, seed=1)
    assert {files[data]: label for data, label in iterable} == expected
    table = read_curated(parquet, split, columns=["image", "label"]).to_pylist()
    assert {files[r["image"]["bytes"]]: r["label"] for r in table} == expected
    assert ParquetImageDataset(parquet, split, decode=False).targets.tolist() == [expected[files[d]] for d, _ in ds]


def test_a_view_by_name_and_resume_states_across_versions_and_views(appended):
    tree, repo, _, old_state, _ = appended
    parquet, files = repo / "data/parquet", _by_file(tree, "train")
    view = ParquetImageDataset(parquet, "train", view="pets", decode=False)
    assert view.classes == ["cat", "dog"]
    want = {f: label - 2 for f, label in _expected(tree, "train", {"cat_1.jpg": "dog"}).items() if label >= 2}
    assert {files[d]: label for d, label in (view[i] for i in range(len(view)))} == want
    whole = ParquetIterableDataset(parquet, "train", decode=False)
    with pytest.raises(ValueError, match="state"):
        whole.load_state_dict(old_state)  # v0's state: another version of the dataset
    pets = ParquetIterableDataset(parquet, "train", view="pets", decode=False)
    with pytest.raises(ValueError, match="state"):
        pets.load_state_dict(whole.state_dict())  # the whole dataset's state: another view
    for extra in ([], ["--view", "pets"]):
        out = _run([sys.executable, "-m", "imagenet_parquet.check", "--repo", str(repo), *extra], repo)
        assert out.startswith("0 problem(s) in 4 shards of 2 split(s)"), out


def test_a_row_count_edited_in_the_history_stops_dvc_repro_and_writes_no_wrong_count(appended):
    """Issue 49 through `dvc repro`: `rows` 15 -> 14 in versions/layout.json passed, into data/metrics/convert.json
    (one row fewer than the shards hold) and dvc.lock. Now the run stops in one line naming the file, the
    generation and the field; restored from git, the next `dvc repro` gives the same metric and dvc.lock."""
    _, repo, _, _, _ = appended
    kept = {name: (repo / name).read_bytes() for name in ("versions/layout.json", "dvc.lock",
                                                          "data/metrics/convert.json")}
    doc = json.loads(kept["versions/layout.json"])
    doc["splits"]["train"][1]["shards"][0]["rows"] -= 1
    (repo / "versions/layout.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    try:
        run = subprocess.run(["dvc", "repro"], cwd=repo, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "DVC_NO_ANALYTICS": "1"})
        said = run.stdout + run.stderr
        assert run.returncode != 0 and "Traceback" not in said, said[-3000:]
        assert re.search(r"versions/layout\.json: train generation 1, shard 0 \('train-g1-h[0-9a-f]{16}\.parquet'\), "
                         r"rows: expected (\d+) \(what the footer of \S+ holds\), found \d+", said), said[-3000:]
        assert (repo / "dvc.lock").read_bytes() == kept["dvc.lock"]
        metric = repo / "data/metrics/convert.json"  # DVC removed it before the stage ran: no wrong count
        assert not metric.exists() or metric.read_bytes() == kept["data/metrics/convert.json"]
    finally:
        (repo / "versions/layout.json").write_bytes(kept["versions/layout.json"])  # `git checkout` of it
        _run(["dvc", "repro"], repo)
    assert {name: (repo / name).read_bytes() for name in kept} == kept
    assert up_to_date(_run(["dvc", "status"], repo))
