"""Local shards after `dvc pull` (issue 28, item 4): `verify=True` checks every image against its row's sha256, a
damaged label is one error naming the shard and row (test_overlay_reader.py), footers are checked against the
overlay by default, and `python -m imagenet_parquet.check` compares a pulled tree with dvc.lock quickly (footers,
overlays, membership) or whole (`--full`: every shard's md5)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset
from imagenet_parquet.format import FormatError, decode_image_index
from imagenet_parquet.overlay import OverlayError, footer_tail
from tests.test_overlay_reader import curated_project


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.chmod(0o644)
    path.write_bytes(bytes(data))


def _image_offset(path: Path, row: int) -> int:
    meta = pq.read_metadata(path)
    return int(decode_image_index(meta.metadata, meta.num_rows, path)[row][0]) + 50


def _check(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "imagenet_parquet.check", "--repo", str(repo), *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> dict[str, Path]:
    return curated_project(tmp_path_factory.mktemp("verify"))


def test_verify_true_refuses_a_flipped_image_byte_that_a_plain_read_yields(tmp_path, project):
    root = tmp_path / "data"
    subprocess.run(["cp", "-r", str(project["repo"] / "data"), str(root)], check=True)
    shard = sorted((root / "parquet" / "train").glob("*.parquet"))[0]
    _flip(shard, _image_offset(shard, 2))
    plain = ParquetImageDataset(root / "parquet", "train", decode=False, overlay=False)
    assert plain[2][0]  # read as is: images are not hashed by default (docs/trainer.md)
    for ds in (ParquetImageDataset(root / "parquet", "train", decode=False, overlay=False, verify=True),
               ParquetImageDataset(root / "parquet", "train", decode=False, verify=True)):
        with pytest.raises(FormatError, match=rf"{shard.name}: row 2: expected an image with the sha256"):
            [ds[i] for i in range(len(ds))]
    stream = ParquetIterableDataset(root / "parquet", "train", decode=False, verify=True, shuffle=False)
    with pytest.raises(FormatError, match="row 2: expected an image"):
        list(stream)


def test_check_command_compares_a_pulled_tree_with_dvc_lock(project):
    repo = project["repo"]
    out = _check(repo)
    assert out.returncode == 0 and "0 problem(s) in 3 shards of 1 split(s)" in out.stdout, out.stdout + out.stderr
    shard = sorted((repo / "data" / "parquet" / "train").glob("*.parquet"))[1]
    original = shard.read_bytes()
    try:
        _flip(shard, _image_offset(shard, 0))  # an image byte: only --full reads it
        assert _check(repo).returncode == 0
        full = _check(repo, "--full")
        assert full.returncode == 1 and f"{shard}: expected md5" in full.stdout
        shard.write_bytes(original)
        _flip(shard, len(original) - len(footer_tail(shard)) + 40)  # a footer byte: the quick check sees it
        quick = _check(repo)
        assert quick.returncode == 1 and ("footer sha256" in quick.stdout or "footer that parses" in quick.stdout)
        shard.write_bytes(original)
        (shard.parent / "stray.parquet").write_bytes(b"PAR1")
        extra = _check(repo)
        assert extra.returncode == 1 and "stray.parquet: expected no such file" in extra.stdout
    finally:
        shard.write_bytes(original)
        (shard.parent / "stray.parquet").unlink(missing_ok=True)
    overlay = repo / "data" / "overlay" / "train.parquet"
    saved = overlay.read_bytes()
    try:
        overlay.unlink()
        gone = _check(repo)
        assert gone.returncode == 1 and "train.parquet: expected (dvc.lock lists it), found no file" in gone.stdout
        with pytest.raises(OverlayError):
            ParquetImageDataset(repo / "data" / "parquet", "train")
    finally:
        overlay.write_bytes(saved)
