"""download stage: put the three ILSVRC2012 archives under paths.raw (local sources: tasks.acquire.local; the space
check: tasks.acquire.space; download.json: tasks.acquire.download_json).

Sources (params.yaml `download:`): `sample` (the built-in sample), a local path or `file://` URL (hard-linked
when on the same filesystem, else symlinked — a 138 GB archive is never copied), `http(s)://` and any fsspec
URL such as `s3://` (streamed by tasks.acquire.fetch: resumable, retried, MD5 while streaming). Free disk space is
checked against what is still to fetch before anything is written. `download.json` records, per archive, the
source (credentials redacted), size, MD5 and how the file was obtained — the content, nothing of this machine, so
the same archives give the same download.json (and dvc.lock) anywhere. The MD5 is computed on the way in (network),
by the sample's writer, or — for a linked local archive — in one read that also indexes the tar headers for the
extract stage (tasks.common.archive_pass; verify then reads nothing). The stage runs on every `dvc repro`
(`always_changed`): an MD5 is reused while the file's (size, mtime_ns, inode) is unchanged (tasks.acquire.md5state,
in paths.work), so download.json — and therefore every later stage — changes only when an archive's content did.
ImageNet-21k's one archive (extract.mode: archive21k) is fetched the same way: tasks.acquire.archive21k.
Folder mode makes no archive (and no sample): `folder` holds a digest of every file's path, size, mtime_ns and
inode (reading 1.28 M files on every run to hash their content would cost more than the pipeline)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.acquire import archive21k
from tasks.acquire.download_json import tree_stat, write_download_json
from tasks.acquire.fetch import FetchOptions, RetryableError, kind, redact, remote_size, resumable_download
from tasks.acquire.local import check_local_sources, link_local, local_path
from tasks.acquire.md5state import CACHE_NAME, SPLIT_OF, archive_md5, cached_md5, prescan_dir, remember_md5
from tasks.acquire.sample import MD5_TABLE, write_sample
from tasks.acquire.space import check_free_space, download_origin, space_needed, unchanged_download
from tasks.common import ARCHIVES
from tasks.common.archive21k import layout
from tasks.common.archive_pass import StreamIndex, save_prescan
from tasks.common.dvc_state import stat_key
from tasks.common.params import DownloadParams, Project, SampleParams

__all__ = [
    "Download",
    "FetchOptions",
    "RetryableError",
    "archive_sources",
    "check_free_space",
    "check_local_sources",
    "fetch_archive",
    "fetch_sample",
    "link_local",
    "local_path",
    "plan",
    "space_needed",
    "tree_stat",
    "write_download_json",
]


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
        return self.layout is not None and self.layout["tar"] != self.layout["archive"]

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


def fetch_archive(
    name: str,
    source: str,
    raw_dir: Path,
    opts: FetchOptions,
    cache_file: Path,
    root: Path = Path("."),
    split: str | None = None,
) -> dict[str, Any]:
    """Bring one archive to raw_dir/name; returns its download.json record (`split`: the split of its images when
    the name does not say: archive21k's .tar, indexed as it is hashed)."""
    dest = raw_dir / name
    how = kind(source)
    if how == "local":
        link = link_local(source, dest, root)
        known, _seen = archive_md5(dest, cache_file, prescan_dir(cache_file), download_origin(source), split=split)
        return {"source": source, "bytes": dest.stat().st_size, "md5": known, "method": "local", "link": link}
    md5 = unchanged_download(dest, source, cache_file)
    if md5 is None:
        raw_dir.mkdir(parents=True, exist_ok=True)
        md5 = _download_and_index(name, source, dest, opts, cache_file, split)
        remember_md5(dest, md5, cache_file, download_origin(source))
    return {"source": redact(source), "bytes": dest.stat().st_size, "md5": md5, "method": how}


def _download_and_index(
    name: str, source: str, dest: Path, opts: FetchOptions, cache_file: Path, split: str | None = None
) -> str:
    """Download one archive; the train and val archives are indexed for the extract stage as the bytes arrive (the
    prescan, tasks.common.archive_pass), so after the network read nothing reads the archive again before convert.
    Returns the MD5 computed on the way in."""
    split = split or SPLIT_OF.get(name)
    size = remote_size(source, opts) if split else None
    if split is None or not size:  # the devkit, or a size nobody announced: downloaded only
        return resumable_download(source, dest, opts, size=size)[1]
    index = StreamIndex(split, dest, size)
    try:
        got, md5 = resumable_download(source, dest, opts, index, size)
    except BaseException:
        index.abort()
        raise
    found = index.result(md5, got)
    if found is not None:
        save_prescan(prescan_dir(cache_file), split, dest, found, stat_key(dest))
    return md5


def fetch_sample(raw_dir: Path, sample: SampleParams, cache_file: Path) -> dict[str, dict[str, Any]]:
    """Write the built-in sample into raw_dir (unless it is there, unchanged, for the same `sample:` params);
    returns the download.json records of its archives."""
    origin = "sample " + ",".join(f"{k}={v}" for k, v in sorted(sample.model_dump().items()))
    md5s = _intact_sample(raw_dir, cache_file, origin)
    if md5s is None:
        md5s = write_sample(raw_dir, sample.classes, sample.train_per_class, sample.val_per_class, sample.seed)
        for name, md5 in md5s.items():
            remember_md5(raw_dir / name, md5, cache_file, origin)
    records = {}
    for name, md5 in md5s.items():
        path = raw_dir / name
        records[name] = {"source": "sample", "bytes": path.stat().st_size, "md5": md5, "method": "sample"}
    return records


def _intact_sample(raw_dir: Path, cache_file: Path, origin: str) -> dict[str, str] | None:
    """The sample's MD5s when raw_dir still holds the very files written for these params (by stat), else None."""
    if not (raw_dir / MD5_TABLE).is_file():
        return None
    md5s = {}
    for name in ARCHIVES.values():
        if not (raw_dir / name).is_file() or (raw_dir / name).is_symlink():
            return None
        md5, seen = cached_md5(raw_dir / name, cache_file)
        if md5 is None or seen != origin:
            return None
        md5s[name] = md5
    return md5s
