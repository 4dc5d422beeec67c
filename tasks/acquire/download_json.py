"""download.json (docs/CONTRACTS.md): per archive the content (its MD5) and where it came from, nothing of this
machine (no stat, no link kind), so the same archives give the same download.json and dvc.lock on every machine;
in folder mode a cheap identity of the tree (`tree_stat`) instead."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from tasks.acquire.remote import redact
from tasks.acquire.sample import MD5_TABLE
from tasks.common import PipelineError, write_json
from tasks.common.archive21k import LAYOUT_KEY

FILE = "download.json"  # under paths.raw
RECORD_KEYS = ("source", "bytes", "md5", "method")


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
    if stale_sample_table(raw_dir, records):
        (raw_dir / MD5_TABLE).unlink()  # a stale sample table must not vouch for real archives
    doc = archives_doc(source, records)
    if layout is not None:
        doc[LAYOUT_KEY] = layout
    if folder is not None:
        doc = {"source": "folder", "archives": {}, "folder": tree_stat(folder)}
        print(f"folder mode: {doc['folder']['files']:,} files under {folder}, no archive needed")
    raw_dir.mkdir(parents=True, exist_ok=True)
    return write_json(raw_dir / FILE, doc)


def archives_doc(source: str, records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """download.json's document for the archives' `records` (without archive21k's layout or folder mode)."""
    archives = {name: {key: r[key] for key in RECORD_KEYS} for name, r in records.items()}
    return {"source": redact(source), "archives": archives}


def stale_sample_table(raw_dir: Path, records: dict[str, dict[str, Any]]) -> bool:
    """Whether raw_dir holds the built-in sample's MD5 table while the records are of other archives."""
    return any(r["method"] != "sample" for r in records.values()) and (raw_dir / MD5_TABLE).exists()


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
