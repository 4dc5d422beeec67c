"""DVC remotes and the training-node round trip: `dvc repro` in a project copy, `scripts/remote.sh` + `dvc push`
to a local directory and to moto's S3 server (127.0.0.1), then `dvc pull` of only the Parquet and the label map
(or one split) in a fresh `git clone`, byte-identical, readable by the reader; raw archives never leave."""
from __future__ import annotations

import filecmp
import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from imagenet_parquet import ParquetImageDataset, load_label_map
from tests.helpers.project import ALWAYS_CHANGED, GIT, copy_project, up_to_date
from tests.helpers.servers import moto_s3_server

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    full_env = {**os.environ, "DVC_NO_ANALYTICS": "1", **(env or {})}
    for key in S3_ENV:  # credentials only where a test passes them
        if not env or key not in env:
            full_env.pop(key, None)
    out = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{cmd} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def pipeline_repo(tmp_path_factory, prefect_api) -> Path:
    """A committed project copy after `dvc repro` on the built-in sample (dvc.lock committed)."""
    repo = copy_project(tmp_path_factory.mktemp("pipeline") / "project")
    _run(["dvc", "repro"], repo)
    _run(["git", "add", "-A"], repo)
    _run([*GIT, "commit", "-qm", "dvc repro", "--allow-empty"], repo)  # dvc.lock may be the committed one, byte for byte
    assert (repo / "data" / "parquet" / "train").is_dir() and (repo / "data" / "label_map.json").is_file()
    return repo


def test_tracked_outputs_name_no_path_of_the_machine(pipeline_repo):
    """Everything DVC hashes or git tracks is the same wherever the project lies: no output names its location
    (a devkit path in extract_report.json once made dvc.lock differ between two clones)."""
    where = str(pipeline_repo.resolve()).encode()
    tracked = [p for d in ("data/manifests", "data/reports", "data/metrics", "versions") for p in (pipeline_repo / d).rglob("*")
               if p.is_file() and p.suffix in (".json", ".md", ".csv", ".jsonl")]
    tracked += [pipeline_repo / "data" / "label_map.json", pipeline_repo / "data" / "raw" / "download.json",
                pipeline_repo / "data" / "raw" / "verify.json", pipeline_repo / "dvc.lock"]
    assert len(tracked) > 8 and [p for p in tracked if where in p.read_bytes()] == []


def _configure(repo: Path, *args: str) -> None:
    _run(["bash", "scripts/remote.sh", *args], repo)
    _run(["git", "add", ".dvc/config"], repo)
    _run([*GIT, "commit", "-qm", f"remote {args[0]}", "--allow-empty"], repo)


def _training_node(repo: Path, dest: Path, targets: list[str], env: dict[str, str] | None = None) -> Path:
    _run(["git", "clone", "-q", str(repo), str(dest)], dest.parent)
    _run(["dvc", "pull", *targets], dest, env)
    return dest


def _assert_identical(repo: Path, node: Path, rel: str) -> None:
    src, dst = repo / rel, node / rel
    if src.is_file():
        assert filecmp.cmp(src, dst, shallow=False), rel
        return
    assert _files(dst) == _files(src) and _files(src), rel
    for name in _files(src):
        assert filecmp.cmp(src / name, dst / name, shallow=False), name


def _assert_pulled_only(node: Path, wanted: list[str]) -> None:
    present = {p for p in ("data/raw", "data/manifests", "data/reports", "data/parquet/train", "data/parquet/val",
                           "data/overlay", "data/label_map.json") if (node / p).exists()}
    assert present == set(wanted), present
    assert not list(node.rglob("*.tar")) and not list(node.rglob("*.tar.gz"))  # never the raw archives


def _assert_no_raw_in_remote(repo: Path, remote_md5s: list[str]) -> None:
    """The remote holds content by MD5: the Parquet and label map are there, no raw archive is."""
    raw_md5 = {_md5(p) for p in sorted((repo / "data" / "raw").glob("*.tar*"))}
    shard_md5 = {_md5(p) for p in sorted((repo / "data" / "parquet").rglob("*.parquet"))}
    stored = set(remote_md5s)
    assert raw_md5 and shard_md5 and shard_md5 <= stored and _md5(repo / "data" / "label_map.json") in stored
    assert not raw_md5 & stored


def _remote_md5s(keys: list[str]) -> list[str]:
    """files/md5/ab/cdef... -> abcdef... (DVC 3 remote layout)."""
    return ["".join(k.split("/")[-2:]).split(".")[0] for k in keys if "/md5/" in f"/{k}"]


def test_local_remote_round_trip(pipeline_repo, tmp_path):
    remote = tmp_path / "remote"
    _configure(pipeline_repo, "local", str(remote))
    assert str(remote) in (pipeline_repo / ".dvc" / "config").read_text()
    _run(["dvc", "push"], pipeline_repo)
    keys = [str(p.relative_to(remote)) for p in sorted(remote.rglob("*")) if p.is_file()]
    _assert_no_raw_in_remote(pipeline_repo, _remote_md5s(keys))

    node = _training_node(pipeline_repo, tmp_path / "node", ["data/parquet", "data/overlay", "data/label_map.json"])
    _assert_pulled_only(node, ["data/parquet/train", "data/parquet/val", "data/overlay", "data/label_map.json"])
    _assert_identical(pipeline_repo, node, "data/parquet")
    _assert_identical(pipeline_repo, node, "data/overlay")
    _assert_identical(pipeline_repo, node, "data/label_map.json")
    train = ParquetImageDataset(node / "data" / "parquet", "train")
    names = [c["name"] for c in load_label_map(node / "data" / "label_map.json")["classes"]]
    assert train.label_names == names and len(train) > 0
    image, label = train[len(train) - 1]
    assert image.mode == "RGB" and 0 <= label < len(names)

    one = _training_node(pipeline_repo, tmp_path / "node-val", ["data/parquet/val"])
    _assert_pulled_only(one, ["data/parquet/val"])
    _assert_identical(pipeline_repo, one, "data/parquet/val")


@pytest.fixture
def moto_s3():
    """moto's S3 server on 127.0.0.1 (a free port) with an empty bucket; yields (endpoint, client)."""
    with moto_s3_server() as (endpoint, s3):
        s3.create_bucket(Bucket="training-data")
        yield endpoint, s3


def test_s3_remote_round_trip_on_moto(pipeline_repo, tmp_path, moto_s3):
    endpoint, s3 = moto_s3
    _configure(pipeline_repo, "s3", "s3://training-data/imagenet", endpoint)
    config = (pipeline_repo / ".dvc" / "config").read_text()
    assert endpoint in config and "testing" not in config and not (pipeline_repo / ".dvc" / "config.local").exists()
    _run(["dvc", "push"], pipeline_repo, S3_ENV)
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket="training-data")
            for o in page.get("Contents", [])]
    assert keys and all(k.startswith("imagenet/") for k in keys)
    _assert_no_raw_in_remote(pipeline_repo, _remote_md5s(keys))

    node = _training_node(pipeline_repo, tmp_path / "node", ["data/parquet", "data/overlay", "data/label_map.json"],
                          S3_ENV)
    _assert_pulled_only(node, ["data/parquet/train", "data/parquet/val", "data/overlay", "data/label_map.json"])
    _assert_identical(pipeline_repo, node, "data/parquet")
    _assert_identical(pipeline_repo, node, "data/overlay")
    _assert_identical(pipeline_repo, node, "data/label_map.json")

    one = _training_node(pipeline_repo, tmp_path / "node-train", ["data/parquet/train"], S3_ENV)
    _assert_pulled_only(one, ["data/parquet/train"])
    _assert_identical(pipeline_repo, one, "data/parquet/train")



def test_reader_and_interop_on_the_pipeline_shards(pipeline_repo, tmp_path, monkeypatch):
    """The reader and HF datasets on shards written by the real convert stage (quirky sample images included)."""
    import duckdb
    import pyarrow.parquet as pq

    from imagenet_parquet import ParquetIterableDataset

    parquet = pipeline_repo / "data" / "parquet"
    names = [c["name"] for c in load_label_map(pipeline_repo / "data" / "label_map.json")["classes"]]
    for split in ("train", "val"):
        table = pq.read_table(parquet / split, columns=["label", "sha256"])
        ds = ParquetImageDataset(parquet, split, transform=lambda im: im.size)
        assert ds.label_names == names and len(ds) == table.num_rows > 0
        assert [ds[i][1] for i in range(len(ds))] == table.column("label").to_pylist()  # every image decodes
        raw = [ParquetIterableDataset(parquet, split, decode=False, rank=r, world_size=2, seed=5) for r in (0, 1)]
        digests = sorted(hashlib.sha256(b).hexdigest() for d in raw for b, _ in d)
        assert digests == sorted(table.column("sha256").to_pylist())
    counts = dict(duckdb.sql(f"SELECT label_name, count(*) FROM read_parquet('{parquet}/train/*.parquet') "
                             "GROUP BY 1").fetchall())
    assert set(counts) == set(names) and sum(counts.values()) == len(ParquetImageDataset(parquet, "train"))

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    hf = datasets.load_dataset("parquet", data_files=sorted(str(p) for p in (parquet / "val").glob("*.parquet")),
                               split="train", cache_dir=str(tmp_path / "hf"))
    assert hf.features["label"].names == names and isinstance(hf.features["image"], datasets.Image)
    assert hf[0]["image"].size == ParquetImageDataset(parquet, "val", transform=lambda im: im.size)[0][0]


def test_speed_only_params_rerun_nothing_and_an_output_param_reruns_its_stage(pipeline_repo):
    """dvc.yaml lists only the keys that change outputs (tasks.common.params `speed_only`): after `dvc repro`,
    changing retries / materialize / workers leaves every stage up to date; quality reruns convert (+ validate)."""
    params = pipeline_repo / "params.yaml"
    original = params.read_text()
    try:
        speed = (original.replace("  retries: 5 ", "  retries: 9 ").replace("  timeout_s: 60 ", "  timeout_s: 30 ")
                 .replace("  materialize: false", "  materialize: true").replace("  workers: auto ", "  workers: 1 "))  # convert and validate
        assert speed.count("\n") == original.count("\n") and speed != original
        params.write_text(speed)
        assert up_to_date(_run(["dvc", "status"], pipeline_repo))
        params.write_text(speed.replace("  quality: 90 ", "  quality: 91 "))
        status = _run(["dvc", "status"], pipeline_repo)
        assert "convert:" in status and "download:" not in status.replace(ALWAYS_CHANGED, "")
        assert re.search(r"changed deps:\s+params.yaml:\s+modified:\s+convert.quality\n", status), status
        assert "extract:" not in status
    finally:
        params.write_text(original)
    assert up_to_date(_run(["dvc", "status"], pipeline_repo))
