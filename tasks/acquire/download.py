"""download stage: put the three ILSVRC2012 archives under paths.raw.

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

import hashlib
import os
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tasks.acquire import archive21k
from tasks.acquire.fetch import FetchOptions, RetryableError, kind, part_path, redact, remote_size, resumable_download
from tasks.acquire.md5state import CACHE_NAME, SPLIT_OF, archive_md5, cached_md5, prescan_dir, remember_md5
from tasks.acquire.sample import MD5_TABLE, write_sample
from tasks.common import ARCHIVES, PipelineError, atomic_path, write_json
from tasks.common.archive21k import LAYOUT_KEY, layout
from tasks.common.archive_pass import StreamIndex, save_prescan
from tasks.common.dvc_state import stat_key
from tasks.common.params import DownloadParams, Project, SampleParams, resolve_path

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
    "plan",
    "space_needed",
    "tree_stat",
    "write_download_json",
]
GB = 1e9
SPACE_MARGIN = 64 << 20  # keep a little room for everything else on the disk
# download.json's record per archive: the content (its MD5) and where it came from, nothing of this machine (no
# stat, no link kind), so the same archives give the same download.json and dvc.lock on every machine
RECORD_KEYS = ("source", "bytes", "md5", "method")


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


def local_path(source: str, root: Path = Path(".")) -> Path:
    """The file a local source names (a `file://` URL or a path; relative paths against `root`, the project)."""
    parts = urlsplit(source)
    if parts.scheme == "file":
        return Path(urllib.request.url2pathname(parts.path))
    return resolve_path(root, source)


def check_local_sources(sources: dict[str, str], root: Path = Path("."), one_archive: bool = False) -> None:
    """Fail before touching anything when local sources are missing, naming all of them at once (`one_archive`:
    archive21k mode's download.archive)."""
    paths = [local_path(s, root) for s in sources.values() if kind(s) == "local"]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing and one_archive:
        raise PipelineError(
            f"expected the archive of per-class tars (params.yaml download.archive) at {missing[0]}, found no such "
            "file. Set download.archive to its file name under download.source, or to its full path or URL."
        )
    if missing:
        raise PipelineError(
            f"expected the ILSVRC2012 archives at {', '.join(missing)}, found no such file"
            f"{'s' if len(missing) > 1 else ''}. Set download.source in params.yaml to the "
            "directory holding the three official archives (or download.train / val / devkit "
            "to each file)."
        )


def check_free_space(raw_dir: Path, needed: dict[str, int]) -> None:
    """Fail before writing anything when the archives to fetch do not fit on the disk of raw_dir."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    total = sum(needed.values())
    free = shutil.disk_usage(raw_dir).free
    if total + SPACE_MARGIN > free:
        raise PipelineError(
            f"{raw_dir}: downloading {', '.join(sorted(needed))} needs {total / GB:.2f} GB free (+ "
            f"{SPACE_MARGIN >> 20} MiB margin), found {free / GB:.2f} GB free. Free some space or point "
            "paths.raw at a larger disk (the full ILSVRC2012: ~147 GB of archives, about as much again for "
            "Parquet — make sure there are 300 GB free)."
        )


# ---------------------------------------------------------------- one archive
def link_local(source: str, dest: Path, root: Path = Path(".")) -> str:
    """Reference a local archive from dest: hard link (same filesystem) else symlink. Never copies."""
    src = local_path(source, root)
    if not src.is_file():
        raise PipelineError(
            f"{src}: expected the archive {dest.name} here, found "
            f"{'a directory' if src.is_dir() else 'nothing'}. Set download.source to the "
            "directory holding the three official archives (or the per-archive path) in params.yaml."
        )
    if _same_file(dest, src):  # already in place: nothing touched, so DVC and verify see the same file
        return "symlink" if dest.is_symlink() else "hardlink"
    with atomic_path(dest) as tmp:
        try:
            os.link(src, tmp)
            how = "hardlink"
        except OSError:  # another filesystem (EXDEV) or links not allowed: reference it instead
            os.symlink(src.resolve(), tmp)
            how = "symlink"
    return how


def _same_file(dest: Path, src: Path) -> bool:
    try:
        return dest.exists() and os.path.samefile(dest, src)
    except OSError:
        return False


def _unchanged_download(dest: Path, source: str, cache_file: Path) -> str | None:
    """The MD5 of an earlier complete download of the same source, when dest is still those bytes."""
    if not dest.is_file() or part_path(dest).exists():
        return None
    md5, origin = cached_md5(dest, cache_file)
    return md5 if origin == _origin(source) else None


def _origin(source: str) -> str:
    """How md5state records an MD5 computed while downloading `source`."""
    return f"download {redact(source)}"


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
        known, _seen = archive_md5(dest, cache_file, prescan_dir(cache_file), _origin(source), split=split)
        return {"source": source, "bytes": dest.stat().st_size, "md5": known, "method": "local", "link": link}
    md5 = _unchanged_download(dest, source, cache_file)
    if md5 is None:
        raw_dir.mkdir(parents=True, exist_ok=True)
        md5 = _download_and_index(name, source, dest, opts, cache_file, split)
        remember_md5(dest, md5, cache_file, _origin(source))
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


def space_needed(sources: dict[str, str], raw_dir: Path, opts: FetchOptions, cache_file: Path) -> dict[str, int]:
    """Bytes still to fetch per network archive (what is already in `.part` or complete does not count)."""
    needed = {}
    for name, source in sources.items():
        if kind(source) in ("sample", "local") or _unchanged_download(raw_dir / name, source, cache_file):
            continue
        part = part_path(raw_dir / name)
        needed[name] = max(0, (remote_size(source, opts) or 0) - (part.stat().st_size if part.exists() else 0))
    return needed


def write_download_json(
    raw_dir: Path,
    source: str,
    records: dict[str, dict[str, Any]],
    folder: Path | None = None,
    layout: dict[str, str] | None = None,
) -> Path:
    """download.json (docs/CONTRACTS.md), plus one printed line per archive (folder mode: the tree's digest;
    `layout`: archive21k mode's files, recorded under `archive21k`)."""
    for name, r in sorted(records.items()):
        print(f"{name}: {r['bytes']:,} bytes, MD5 {r['md5']}, {r.get('link', r['method'])} from {r['source']}")
    if any(r["method"] != "sample" for r in records.values()):
        (raw_dir / MD5_TABLE).unlink(missing_ok=True)  # a stale sample table must not vouch for real archives
    archives = {name: {key: r[key] for key in RECORD_KEYS} for name, r in records.items()}
    doc: dict[str, Any] = {"source": redact(source), "archives": archives}
    if layout is not None:
        doc[LAYOUT_KEY] = layout
    if folder is not None:
        doc = {"source": "folder", "archives": {}, "folder": tree_stat(folder)}
        print(f"folder mode: {doc['folder']['files']:,} files under {folder}, no archive needed")
    raw_dir.mkdir(parents=True, exist_ok=True)
    return write_json(raw_dir / "download.json", doc)


def tree_stat(folder: Path) -> dict[str, Any]:
    """A cheap identity of a folder-mode tree: a digest of every file's relative path, size, mtime_ns and inode
    (a sorted walk; no file is read), so any added, removed or replaced file changes it."""
    if not folder.is_dir():
        raise PipelineError(
            f"params.yaml extract.folder: expected a directory holding train/<class>/* and val/<class>/*, found "
            f"{'a file' if folder.exists() else 'nothing'} at {folder}; fix extract.folder"
        )
    digest, files, size = hashlib.sha256(), 0, 0
    for top, dirs, names in os.walk(folder):
        dirs.sort()
        rel = os.path.relpath(top, folder)
        for name in sorted(names):
            try:
                st = os.stat(os.path.join(top, name))  # a link is followed, as the extract stage reads it
                key = f"{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"
            except OSError:  # a broken link: recorded as such
                st, key = None, "missing"
            digest.update(f"{rel}/{name}\0{key}\n".encode("utf-8", "surrogateescape"))  # any name, even not UTF-8
            files, size = files + 1, size + (st.st_size if st else 0)
    return {"path": str(folder), "files": files, "bytes": size, "stat_sha256": digest.hexdigest()}
