"""Bringing one archive into paths.raw, the acquire core that the ILSVRC2012 archives, the built-in sample and
ImageNet-21k's one archive (tasks.acquire.archive21k) all go through: a local path or `file://` URL is hard-linked
when on the same filesystem, else symlinked (tasks.acquire.local; a 138 GB archive is never copied); an `http(s)://`
or fsspec URL such as `s3://` is streamed (tasks.acquire.fetch: resumable, retried, MD5 while streaming); the sample
is written (tasks.acquire.sample). Each archive's MD5 is known once: computed on the way in (network), by the sample's
writer, or — for a linked local archive — in one read that also indexes the tar headers for the extract stage
(tasks.common.archive_pass), and reused while the file's (size, mtime_ns, inode) is unchanged (tasks.acquire.md5state).
Returns download.json records (tasks.acquire.download_json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.acquire.fetch import resumable_download
from tasks.acquire.local import link_local
from tasks.acquire.md5state import SPLIT_OF, archive_md5, cached_md5, prescan_dir, remember_md5
from tasks.acquire.remote import FetchOptions, kind, redact, remote_size
from tasks.acquire.sample import MD5_TABLE, write_sample
from tasks.acquire.space import download_origin, unchanged_download
from tasks.common import ARCHIVES
from tasks.common.archive_pass import StreamIndex, save_prescan
from tasks.common.dvc_state import stat_key
from tasks.common.params import SampleParams


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
    origin = sample_origin(sample)
    md5s = intact_sample(raw_dir, cache_file, origin)
    if md5s is None:
        md5s = write_sample(raw_dir, sample.classes, sample.train_per_class, sample.val_per_class, sample.seed)
        for name, md5 in md5s.items():
            remember_md5(raw_dir / name, md5, cache_file, origin)
    records = {}
    for name, md5 in md5s.items():
        path = raw_dir / name
        records[name] = {"source": "sample", "bytes": path.stat().st_size, "md5": md5, "method": "sample"}
    return records


def sample_origin(sample: SampleParams) -> str:
    """Who wrote the sample's archives, as the MD5 cache records it: the `sample:` params."""
    return "sample " + ",".join(f"{k}={v}" for k, v in sorted(sample.model_dump().items()))


def intact_sample(raw_dir: Path, cache_file: Path, origin: str) -> dict[str, str] | None:
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
