"""bench_pipeline's mirror (benchmarks/mirror.py): every round of a real JPEG is a perceptually distinct variant
(phash more than validate.near_duplicates_distance apart), the bytes are unique and the archives deterministic."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from benchmarks import mirror
from tasks.acquire.sample import write_sample
from tests.helpers.project import SHARED

SAMPLES = SHARED / "imagenet-samples"
SOURCES = 5  # real JPEGs cycled: 38 real images in the mirror below, so 7-8 rounds of each


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SAMPLES.is_dir():
        pytest.skip("../shared/data/imagenet-samples is absent")
    folder = tmp_path_factory.mktemp("sources")
    for path in sorted(SAMPLES.glob("*.JPEG"))[:: 1000 // SOURCES][:SOURCES]:
        (folder / path.name).symlink_to(path)
    return folder


def build(out: Path, sources: Path) -> dict[str, str]:
    with mirror.variant_images(workers=2) as images:
        return write_sample(out, classes=2, train_per_class=20, val_per_class=2, real_images=sources,
                            image_source=images)


def test_variants_of_one_source_are_not_near_duplicates(tmp_path: Path, sources: Path) -> None:
    md5s = build(tmp_path / "a", sources)
    found = mirror.check_mirror(tmp_path / "a", SOURCES)
    assert found["images"] == 44 and found["same_source_pairs"] == SOURCES * 7 * 6 // 2 + 3 * 7  # 3 sources x 8
    assert found["same_source_le_8"] == 0 and found["same_source_min"] > 8, found
    assert found["pairs_le_8"] == 0 and found["train_pairs_le_4"] == 0, found
    images = [
        archive.read_bytes()[offset : offset + size]
        for _split, archive, offset, size in mirror.mirror_images(tmp_path / "a")
    ]
    assert len({hashlib.sha256(data).digest() for data in images}) == len(images)  # unique bytes: leakage 0
    assert build(tmp_path / "b", sources) == md5s  # deterministic: same folder and size, same archives


def test_check_finds_the_old_com_only_variants(tmp_path: Path, sources: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old mirror (every round the source's own pixels, only a COM segment added) fails the same check."""
    monkeypatch.setattr(mirror, "reencoded", lambda data, k: data)
    build(tmp_path / "old", sources)
    found = mirror.check_mirror(tmp_path / "old", SOURCES)
    assert found["same_source_min"] == 0 and found["same_source_le_8"] == found["same_source_pairs"] > 0
    assert found["pairs_le_8"] >= found["same_source_pairs"] and found["train_pairs_le_4"] > 0
