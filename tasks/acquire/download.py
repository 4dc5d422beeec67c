"""download stage: put the three ILSVRC2012 archives (or ImageNet-21k's one) under paths.raw. This module is the
stage's plan: which archives come from where, per extract mode (`plan`), and the free space that takes
(`space_needed`). It chooses the variant and sits above both the acquire core (tasks.acquire.obtain: each archive
linked, downloaded or written as the built-in sample, its MD5 known once; tasks.acquire.space: the free-space check)
and ImageNet-21k's variant built on that core (tasks.acquire.archive21k: a .tar.gz decompressed once).
download.json: tasks.acquire.download_json.

Sources (params.yaml `download:`): `sample` (the built-in sample), a local path or `file://` URL (linked, never
copied), `http(s)://` and any fsspec URL such as `s3://` (streamed: resumable, retried, MD5 while streaming). Free
disk space is checked against what is still to fetch before anything is written. `download.json` records, per
archive, the source (credentials redacted), size, MD5 and how the file was obtained — the content, nothing of this
machine, so the same archives give the same download.json (and dvc.lock) anywhere. The stage runs on every
`dvc repro` (`always_changed`): an MD5 is reused while the file's (size, mtime_ns, inode) is unchanged
(tasks.acquire.md5state, in paths.work), so download.json — and therefore every later stage — changes only when an
archive's content did. Folder mode makes no archive (and no sample): `folder` holds a digest of every file's path,
size, mtime_ns and inode (reading 1.28 M files on every run to hash their content would cost more than the
pipeline)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasks.acquire import archive21k
from tasks.acquire.md5state import CACHE_NAME
from tasks.acquire.remote import FetchOptions
from tasks.acquire.space import bytes_to_fetch
from tasks.common import ARCHIVES
from tasks.common.archive21k import is_gzip, layout
from tasks.common.params import DownloadParams, Project, SampleParams


# ---------------------------------------------------------------- sources
@dataclass(frozen=True)
class Download:
    """The stage's job, from params.yaml: where each archive comes from, where it goes, how to fetch it."""

    raw_dir: Path
    cache_file: Path
    root: Path  # relative local sources resolve against it (the project)
    source: str  # download.source as given (recorded in download.json, credentials redacted)
    sources: dict[str, str]  # archive name -> "sample", a local path or a URL
    opts: FetchOptions
    sample: SampleParams
    folder: Path | None = None  # folder mode (extract.mode: folder): the tree; no archive is made
    layout: dict[str, str] | None = None  # archive21k mode: {"archive": as published, "tar": what extract reads}

    @property
    def split_of(self) -> dict[str, str]:
        """Archive name -> the split its images belong to, where the name does not say (archive21k's .tar)."""
        return {self.layout["tar"]: "train"} if self.layout else {}

    @property
    def gzipped(self) -> bool:
        """archive21k mode with a .tar.gz: decompressed once after it is fetched (tasks.acquire.archive21k)."""
        return _gzipped(self.layout)

    @property
    def uses_sample(self) -> bool:
        return "sample" in self.sources.values()

    def fetched(self) -> dict[str, str]:
        """The archives that come from a path or URL (not from the built-in sample), in ARCHIVES order."""
        return {name: source for name, source in self.sources.items() if source != "sample"}


def plan(project: Project) -> Download:
    """The stage's job from params.yaml `download:`, `sample:` and `paths:`."""
    params, extract = project.params.download, project.params.extract
    folder = project.resolve(extract.folder) if extract.mode == "folder" and extract.folder else None
    one = extract.mode == "archive21k"
    return Download(
        project.path("raw"),
        project.path("work") / CACHE_NAME,
        project.root,
        params.source,
        {} if folder else archive21k.archive_source(params) if one else archive_sources(params),
        FetchOptions.from_params(params),
        project.params.sample,
        folder,
        layout(params) if one else None,
    )


def archive_sources(params: DownloadParams) -> dict[str, str]:
    """{archive name: source}: the per-archive override, else `<download.source>/<official name>`."""
    source = params.source
    sources = {}
    for key, name in ARCHIVES.items():
        override = getattr(params, key)
        if override:
            sources[name] = override
        elif source == "sample":
            sources[name] = "sample"
        else:
            sep = "" if source.endswith("/") else "/"
            sources[name] = f"{source}{sep}{name}" if "://" in source else str(Path(source) / name)
    return sources


def space_needed(
    sources: dict[str, str],
    raw_dir: Path,
    opts: FetchOptions,
    cache_file: Path,
    layout: dict[str, str] | None = None,
    root: Path = Path("."),
) -> dict[str, int]:
    """The free space the stage needs, per file written: each network archive's bytes still to fetch
    (tasks.acquire.space), and, for archive21k's .tar.gz (`layout`), the .tar it is decompressed into (`root`: where
    local sources resolve)."""
    needed: dict[str, int] = {}
    if _gzipped(layout):
        for name, source in sources.items():
            needed |= archive21k.decompression_space(name, source, raw_dir, opts, cache_file, root)
    return needed | bytes_to_fetch(sources, raw_dir, opts, cache_file)


def _gzipped(archive21k_layout: dict[str, str] | None) -> bool:
    """archive21k mode with a .tar.gz (decompressed once into the .tar every later stage reads)."""
    return archive21k_layout is not None and is_gzip(archive21k_layout["archive"])
