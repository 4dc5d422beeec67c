"""ImageNet-21k's layout (params.yaml `extract.mode: archive21k`): the names of its files, shared by the download,
verify and extract stages (the stages themselves: tasks.acquire.archive21k, tasks.extract.stage)."""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import urlsplit

from tasks.common.params import DownloadParams

LAYOUT_KEY = "archive21k"  # download.json / verify.json: {"archive": as published, "tar": the file extract reads}
GZIP_SUFFIXES = (".tar.gz", ".tgz")


def published_name(archive: str) -> str:
    """The file name of `download.archive` (a name, a path or a URL)."""
    return PurePosixPath(urlsplit(archive).path if "://" in archive else archive.replace("\\", "/")).name


def is_gzip(name: str) -> bool:
    return name.lower().endswith(GZIP_SUFFIXES)


def tar_name(name: str) -> str:
    """The uncompressed tar every later stage reads: the archive itself, or `<stem>.tar` of a .tar.gz / .tgz."""
    if not is_gzip(name):
        return name
    stem = name[: -len(".tar.gz")] if name.lower().endswith(".tar.gz") else name[: -len(".tgz")]
    return stem + ".tar"


def layout(params: DownloadParams) -> dict[str, str]:
    assert params.archive is not None  # Params refuses archive21k mode without one
    name = published_name(params.archive)
    return {"archive": name, "tar": tar_name(name)}
