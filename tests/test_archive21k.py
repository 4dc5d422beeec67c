"""ImageNet-21k's layout (issue 22, part 2): `extract.mode: archive21k`, one archive of per-class `<wnid>.tar` tars
(`download.archive`), indexed in place; val held out of train (`extract.holdout`); the catalog from
`extract.catalog`; an optional MD5 table; a .tar.gz decompressed once into <paths.raw>/<stem>.tar."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.acquire import verify as vf
from tasks.acquire.archive21k import gunzip
from tasks.common import PipelineError
from tasks.common.archive_pass import load_prescan
from tasks.extract import stage as extract
from tasks.extract.holdout import holdout_value
from tests.helpers.archives import special, tar_bytes
from tests.helpers.datasets import small_jpeg
from tests.helpers.docs import readme_params
from tests.helpers.params import project, write_params
from tests.helpers.project import copy_project

WNIDS = [f"n{10_000_000 + 37 * k:08d}" for k in range(30)]  # 30 wnids beyond ILSVRC2012's 1000
# 6 images a class, half held out: seed 15 leaves every class images in both splits (validate wants each in val)
HOLDOUT = {"fraction": 0.5, "seed": 15}
BOUNDS = {"train_count": [0, 50], "val_count": [0, 50]}


def _images(wnid: str, count: int, first: int = 0) -> list[tuple[str, bytes]]:
    base = int(wnid[1:]) % 100_000
    return [(f"{wnid}_{i}.JPEG", small_jpeg(base * 10 + i)) for i in range(first, first + count)]


def write_archive(path: Path, per_class: int = 6, extra: dict[str, int] | None = None) -> dict[str, str]:
    """winter21_whole.tar-shaped: one tar of <wnid>.tar, each holding that class's JPEGs; image name -> wnid."""
    classes = {w: _images(w, per_class) + _images(w, (extra or {}).get(w, 0), per_class) for w in WNIDS}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(tar_bytes([(f"{w}.tar", tar_bytes(members)) for w, members in sorted(classes.items())]))
    return {name: w for w, members in classes.items() for name, _ in members}


def _gzip(tar: Path, gz: Path) -> Path:
    gz.write_bytes(gzip.compress(tar.read_bytes(), mtime=0))
    return gz


def _held(names: dict[str, str]) -> set[str]:
    return {n for n in names if holdout_value(n, HOLDOUT["seed"]) < int(HOLDOUT["fraction"] * (1 << 64))}


def _manifest(repo: Path, split: str) -> list[dict]:
    return pq.read_table(repo / f"data/manifests/{split}.parquet").to_pylist()


def _shards(repo: Path) -> dict[str, bytes]:
    return {str(p.relative_to(repo)): p.read_bytes() for p in sorted((repo / "data/parquet").rglob("*.parquet"))}


def _dvc(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`dvc ARGS` in `repo`, the stages' printed lines logged (Prefect at INFO: the tests run it at WARNING)."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PREFECT_LOGGING_LEVEL": "INFO"}
    return subprocess.run(["dvc", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=600)


def _repro(repo: Path, *args: str) -> str:
    """`dvc repro ARGS`, which must succeed: its stdout and stderr (the stages' printed lines are logged there)."""
    result = _dvc(repo, "repro", *args)
    assert result.returncode == 0, f"dvc repro failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


def test_a_tar_and_its_tar_gz_through_dvc_repro_give_the_same_shards_and_a_stable_holdout(tmp_path, prefect_api):
    src = tmp_path / "src"
    names = write_archive(src / "winter21_whole.tar")
    _gzip(src / "winter21_whole.tar", src / "winter21_whole.tar.gz")
    repo = copy_project(tmp_path / "project")
    snippet = readme_params("own-21k", download__source=str(src), extract__holdout=HOLDOUT)  # the README's keys
    extract_params = snippet["extract"]
    write_params(repo, download=snippet["download"], verify=snippet["verify"], extract=extract_params, validate=BOUNDS)
    out = _repro(repo)
    assert "NOT COMPARED: there is no MD5 table" in out
    verified = json.loads((repo / "data/raw/verify.json").read_text())
    assert verified["checksums"].startswith("none: no MD5 table")
    assert verified["archives"]["winter21_whole.tar"]["expected"] is None
    md5 = hashlib.md5((src / "winter21_whole.tar").read_bytes()).hexdigest()
    assert verified["archives"]["winter21_whole.tar"]["md5"] == md5
    assert (repo / "data/raw/winter21_whole.tar").samefile(src / "winter21_whole.tar")  # linked, never copied
    prescan = load_prescan(repo / "data/scratch/prescan", "train", repo / "data/raw/winter21_whole.tar", md5)
    assert prescan is not None and prescan[0].num_rows == len(names)  # MD5 and index in one read, used by extract
    label_map = json.loads((repo / "data/label_map.json").read_text())
    assert [(c["label"], c["wnid"]) for c in label_map["classes"]] == list(enumerate(sorted(WNIDS)))
    rows = {split: _manifest(repo, split) for split in ("train", "val")}
    assert {r["name"] for r in rows["val"]} == _held(names) and 0 < len(rows["val"]) < len(names)
    assert {r["name"] for r in rows["train"]} == set(names) - _held(names)
    assert all(r["label"] == sorted(WNIDS).index(names[r["name"]]) for s in rows.values() for r in s)
    assert all(r["source"] == "data/raw/winter21_whole.tar" for s in rows.values() for r in s)
    shards, manifests = _shards(repo), {s: (repo / f"data/manifests/{s}.parquet").read_bytes() for s in rows}
    assert shards and all(check["status"] != "fail" for check in
                          json.loads((repo / "data/reports/schema_report.json").read_text())["checks"])

    # the .tar.gz: decompressed once into data/raw/winter21_whole.tar; the same manifests, the same shards
    shutil.rmtree(repo / "data/parquet")
    write_params(repo, download={"source": str(src), "archive": "winter21_whole.tar.gz"}, extract=extract_params,
                 validate=BOUNDS)
    out = _repro(repo)
    assert "decompressed once into" in out and "JPEGs do not compress" in out
    raw = repo / "data/raw/winter21_whole.tar"
    assert not raw.samefile(src / "winter21_whole.tar") and hashlib.md5(raw.read_bytes()).hexdigest() == md5
    assert {s: (repo / f"data/manifests/{s}.parquet").read_bytes() for s in rows} == manifests
    assert _shards(repo) == shards
    assert not list((repo / "data/raw").glob(".*tmp*"))  # no temporary file left behind

    # images added to some classes, checked against a table: no image moves between train and val
    bigger = write_archive(src / "bigger.tar", extra={WNIDS[0]: 6, WNIDS[7]: 3})
    md5 = hashlib.md5((src / "bigger.tar").read_bytes()).hexdigest()
    (tmp_path / "md5.tsv").write_text(f"name\tmd5\nbigger.tar\t{md5}\n")
    write_params(repo, download={"source": str(src), "archive": "bigger.tar"}, extract=extract_params,
                 validate=BOUNDS, verify={"checksums": str(tmp_path / "md5.tsv")})
    out = _repro(repo, "extract")
    assert f"bigger.tar: MD5 {md5} matches the {tmp_path / 'md5.tsv'} table" in out
    val = {r["name"] for r in _manifest(repo, "val")}
    assert val & set(names) == {r["name"] for r in rows["val"]} and val == _held(bigger)


@pytest.mark.parametrize("member, why", [
    (("../x.JPEG", b"x"), "its path contains '..'"),
    (("/etc/x.JPEG", b"x"), "it has an absolute path"),
    (special("link.JPEG", tarfile.SYMTYPE, "/etc/passwd"), "it is a symbolic link"),
])
def test_a_malicious_inner_member_is_refused_naming_the_archive_and_member(tmp_path, member, why):
    archive = tmp_path / "raw/evil.tar"
    archive.parent.mkdir(parents=True)
    archive.write_bytes(tar_bytes([(f"{WNIDS[0]}.tar", tar_bytes(_images(WNIDS[0], 2) + [member]))]))
    with pytest.raises(PipelineError) as err:
        extract.scan_archive_split("train", archive, tmp_path / "staging", tmp_path)
    name = member[0] if isinstance(member, tuple) else member.name
    assert f"{archive} member {WNIDS[0]}.tar: refused member {name!r}: {why}" in str(err.value)
    assert not (tmp_path / "staging/train.parquet").exists()


def test_a_malicious_member_through_dvc_repro_fails_clearly_with_no_outputs(tmp_path, prefect_api):
    src = tmp_path / "src"
    src.mkdir()
    (src / "evil.tar.gz").write_bytes(gzip.compress(tar_bytes([
        (f"{WNIDS[0]}.tar", tar_bytes(_images(WNIDS[0], 2))), (f"{WNIDS[1]}.tar", tar_bytes([("../x.JPEG", b"x")]))])))
    repo = copy_project(tmp_path / "project")
    write_params(repo, download={"source": str(src), "archive": "evil.tar.gz"},
                 extract={"mode": "archive21k", "catalog": "derived", "holdout": HOLDOUT}, validate=BOUNDS)
    result = _dvc(repo, "repro")
    assert result.returncode != 0
    assert f"evil.tar member {WNIDS[1]}.tar: refused member '../x.JPEG': its path contains '..'" in (
        result.stdout + result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    assert not (repo / "data/manifests").exists() and not (repo / "data/parquet").exists()
    assert not (repo / "data/label_map.json").exists()


@pytest.mark.parametrize("extract_params, download, message", [
    ({"holdout": None}, {}, ("extract.holdout: expected {fraction, seed} (the archive ships no val split) with "
                             "mode: archive21k, found null")),
    ({"catalog": "auto"}, {}, ("extract.catalog: expected derived (the wnids alone) or a wnid<TAB>words table with "
                               "mode: archive21k")),
    ({}, {"archive": None}, "download.archive: expected the archive (a file name under download.source, or a path"),
    ({}, {"archive": "w.tar", "train": "t.tar"},
     "download.train / val / devkit null with extract.mode: archive21k, found download.train: 't.tar'"),
    ({}, {"archive": "w.zip"}, "download.archive: expected a file ending in .tar, .tar.gz, .tgz, found 'w.zip'"),
    ({}, {"source": "sample"}, "download.archive: expected a path or URL with download.source: sample"),
    ({"mode": "archives", "catalog": "auto", "holdout": None}, {},
     "download.archive: expected null with extract.mode: archives"),
])
def test_the_mode_refuses_incomplete_params_by_key(tmp_path, extract_params, download, message):
    extract_params = {"mode": "archive21k", "catalog": "derived", "holdout": HOLDOUT, **extract_params}
    with pytest.raises(PipelineError) as err:
        project(tmp_path, download={"source": "/data", "archive": "w.tar", **download}, extract=extract_params)
    assert message in str(err.value)


def _raw_21k(tmp_path: Path) -> Path:
    raw = tmp_path / "raw"
    write_archive(raw / "w.tar", per_class=1)
    record = {"source": "x", "bytes": (raw / "w.tar").stat().st_size, "md5": "0" * 32, "method": "local"}
    doc = {"source": "x", "archives": {"w.tar": record}, "archive21k": {"archive": "w.tar", "tar": "w.tar"}}
    (raw / "download.json").write_text(json.dumps(doc))
    return raw


def test_verify_compares_with_a_table_and_refuses_the_ilsvrc2012_tables(tmp_path):
    raw = _raw_21k(tmp_path)
    (tmp_path / "bad.tsv").write_text(f"name\tmd5\nw.tar\t{'a' * 32}\n")
    table, expected = vf.expected_md5s(str(tmp_path / "bad.tsv"), raw)
    assert expected == {"w.tar": "a" * 32}
    result = vf.check_archive("w.tar", raw, expected["w.tar"], tmp_path / "cache.json", table, False, "train")
    assert not result["ok"] and f"expected MD5 {'a' * 32}" in result["error"] and (raw / "w.tar.corrupt").exists()
    with pytest.raises(PipelineError, match=r"verify.checksums: expected auto .* found official"):
        vf.expected_md5s("official", raw)
    (tmp_path / "other.tsv").write_text(f"name\tmd5\nother.tar\t{'a' * 32}\n")
    with pytest.raises(PipelineError, match=r"expected a row for w.tar \(download.archive\)"):
        vf.expected_md5s(str(tmp_path / "other.tsv"), raw)


def test_gunzip_reads_every_member_and_leaves_nothing_of_a_damaged_stream(tmp_path):
    data = tar_bytes(_images(WNIDS[0], 3))
    gz = tmp_path / "a.tar.gz"
    gz.write_bytes(gzip.compress(data[:5000], mtime=0) + gzip.compress(data[5000:], mtime=0))  # two members
    gz_md5, tar_md5, size = gunzip(gz, tmp_path / "a.tar", chunk=1024, progress=False)
    assert (tmp_path / "a.tar").read_bytes() == data and size == len(data)
    assert (gz_md5, tar_md5) == (hashlib.md5(gz.read_bytes()).hexdigest(), hashlib.md5(data).hexdigest())
    for damaged, found in ((gz.read_bytes()[:-10], "truncated"), (b"not gzip at all", "damaged gzip data")):
        (tmp_path / "b.tar.gz").write_bytes(damaged)
        with pytest.raises(PipelineError, match=rf"b.tar.gz: expected a complete gzip stream of a tar, .*{found}"):
            gunzip(tmp_path / "b.tar.gz", tmp_path / "b.tar", chunk=1024, progress=False)
        assert not (tmp_path / "b.tar").exists() and not list(tmp_path.glob(".b.tar*"))
    bomb = gzip.compress(b"\0" * (64 << 20), mtime=0)  # 64 MiB of zeros in ~64 KiB: inflated a block at a time
    (tmp_path / "z.tar.gz").write_bytes(bomb)
    assert gunzip(tmp_path / "z.tar.gz", tmp_path / "z.tar", chunk=1 << 16, progress=False)[2] == 64 << 20
