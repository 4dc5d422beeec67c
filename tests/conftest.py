"""Shared fixtures: a real Prefect server (started on first request), the sample release, project copies."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.project import SHARED, copy_project
from tests.helpers.servers import isolate_prefect, prefect_api_at, prefect_server
from tests.helpers.turbojpeg import use_a_library

isolate_prefect()  # before anything imports prefect: the session's own PREFECT_HOME, quiet, no analytics
# The readers' default decoder ("auto") takes TurboJPEG 3's region decode when a library is there: the suite runs
# with it (tests/test_crops.py also runs each decoder by name).
use_a_library()


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory) -> Iterator[str]:
    """A real `prefect server start` on 127.0.0.1, started when a test first asks for it and kept for the session.

    Ask for it in every test that runs a Prefect flow in-process or spawns stage commands (`dvc repro`,
    `python -m flows.<stage>`, a served deployment): this process's Prefect client and every child process then
    talk to it (without it, each stage command would start Prefect's own temporary server)."""
    log = tmp_path_factory.mktemp("prefect-server") / "server.log"
    with prefect_server(log) as url, prefect_api_at(url):
        yield url


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, or skip (real-data tests run in CI, where it exists)."""
    if not (SHARED / "imagenet").is_dir():
        pytest.skip("../shared/data is absent")
    return SHARED


@pytest.fixture(scope="session")
def sample_release(tmp_path_factory) -> Path:
    """The built-in sample (default size), written once per session: the three archives + sample_md5.tsv."""
    from tasks.acquire.sample import write_sample

    out = tmp_path_factory.mktemp("sample-release")
    write_sample(out)
    return out


@pytest.fixture
def project_copy(tmp_path) -> Path:
    """A fresh git + DVC copy of the project (see tests.helpers.project.copy_project)."""
    return copy_project(tmp_path / "project")
