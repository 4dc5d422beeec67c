"""Issue 36, a case not yet run: two curation versions of one project (a curation-only change: new data/overlay,
same shards), both pushed; `from_dvc` at the older git revision, over HTTP and from moto's S3, gives that
revision's curated labels (and HEAD the newer ones), and `python -m imagenet_parquet.check` on a checkout moved to
the other revision without `dvc checkout` reports the overlay that is not the revision's, then passes after it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from imagenet_parquet import ParquetImageDataset
from tests.helpers.dvc_remote import run
from tests.helpers.images import identify
from tests.helpers.project import GIT
from tests.helpers.range_files import serving
from tests.helpers.servers import moto_s3_server
from tests.test_overlay_reader import curated_project, write_curation

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("revisions")
    project = curated_project(root)
    repo = project["repo"]
    first = {int(k): v for k, v in json.loads((root / "want.json").read_text()).items()}
    old = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    second = write_curation(repo / "data", sorted((repo / "data/parquet/train").glob("*.parquet")), seed=9)
    run(["dvc", "commit", "-q", "-f"], repo)
    run(["dvc", "push", "-q"], repo)
    run(["git", "add", "-A"], repo)
    run([*GIT, "commit", "-qm", "curation v2"], repo)
    run(["git", "pull", "-q"], project["node"])
    assert first != second
    return {**project, "old": old, "first": first, "second": second}


def _pairs(ds) -> dict[int, int]:
    return {int(i): int(y) for i, y in (ds[k] for k in range(len(ds)))}


def _open(versions, url: str, cache: Path, rev: str | None, **kw) -> ParquetImageDataset:
    return ParquetImageDataset.from_dvc(versions["node"], "data/parquet", rev=rev, split="train", remote=url,
                                        cache_dir=cache, transform=identify, **kw)


def test_from_dvc_over_http_at_the_older_revision_gives_its_curation(versions, tmp_path):
    with serving(versions["remote"]) as (url, _):
        assert _pairs(_open(versions, url, tmp_path / "c", versions["old"])) == versions["first"]
        assert _pairs(_open(versions, url, tmp_path / "c", None)) == versions["second"]  # one cache, both versions
        assert _pairs(_open(versions, url, tmp_path / "c", "HEAD~1")) == versions["first"]


def test_from_dvc_from_s3_at_the_older_revision_gives_its_curation(versions, tmp_path, monkeypatch):
    with moto_s3_server() as (endpoint, s3):
        s3.create_bucket(Bucket="curated")
        for path in sorted(versions["remote"].rglob("*")):
            if path.is_file():
                s3.upload_file(str(path), "curated", f"store/{path.relative_to(versions['remote'])}")
        for key, value in S3_ENV.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        old = _open(versions, "s3://curated/store", tmp_path / "c", versions["old"])
        assert _pairs(old) == versions["first"]
        assert _pairs(_open(versions, "s3://curated/store", tmp_path / "c", "HEAD")) == versions["second"]


def test_check_on_a_checkout_moved_to_another_revision(versions, tmp_path):
    node = tmp_path / "node"
    run(["git", "clone", "-q", str(versions["repo"]), str(node)], tmp_path)
    run(["dvc", "remote", "add", "-f", "-d", "--local", "store", str(versions["remote"])], node)
    run(["dvc", "pull", "-q"], node)

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "imagenet_parquet.check", "--repo", str(node)],
                              capture_output=True, text=True, timeout=120)

    assert check().returncode == 0
    run(["git", "checkout", "-q", versions["old"]], node)  # dvc.lock of v1, data/overlay still v2's
    unpulled = check()  # v1's listing of data/overlay is not in this clone's cache yet
    assert unpulled.returncode == 1 and "run `dvc pull data/overlay`" in unpulled.stderr, unpulled.stderr
    run(["dvc", "pull", "-q"], node)  # v1's objects are in the remote (pushed then)
    assert check().returncode == 0
    assert _pairs(ParquetImageDataset(node / "data/parquet", "train", transform=identify)) == versions["first"]
    run(["git", "checkout", "-q", "-"], node)  # back to v2's dvc.lock, v1's overlay still in the tree
    stale = check()
    assert stale.returncode == 1 and "data/overlay/train.parquet: expected md5" in stale.stdout, stale.stdout
    run(["dvc", "checkout", "-q"], node)
    assert check().returncode == 0
