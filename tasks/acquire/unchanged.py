"""The download stage's no-op, decided before Prefect is imported.

`dvc repro` runs the download stage every time (dvc.yaml `always_changed`: only the stage can tell whether the
archives it links were replaced). When they were not, the flow would rewrite download.json byte for byte and the
later stages would be skipped; starting Prefect for that (its import alone ~1 CPU-second, a flow run against the
server a few more) made a no-op `dvc repro` cost 5-7 s. `exit_if_unchanged()` (flows/download.py, first thing)
rebuilds download.json's records by stat alone, as the flow would, and exits 0 without a flow run when they equal
the file on disk. It leaves everything else to the flow (which then runs as before): a network or fsspec source
(only a request can tell whether it changed), folder and archive21k modes, an archive missing, replaced or not yet
hashed (the MD5 cache of tasks.acquire.md5state is keyed by size, mtime_ns and inode), a temporary left by a
killed run, a stale sample table, a decompressed tar to remove."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tasks.acquire import archive21k, download_json
from tasks.acquire.download import Download, plan
from tasks.acquire.local import local_path
from tasks.acquire.md5state import cached_md5
from tasks.acquire.obtain import intact_sample, sample_origin
from tasks.acquire.remote import kind
from tasks.common.params import load_project
from tasks.common.runlock import claim_run


def stat_records(job: Download) -> dict[str, dict[str, Any]] | None:
    """download.json's archive records as the flow would write them now, found by stat alone; None where only the
    flow can tell (see the module's docstring)."""
    if job.folder is not None or job.layout is not None:
        return None
    if any(source != "sample" and kind(source) != "local" for source in job.sources.values()):
        return None
    records: dict[str, dict[str, Any]] = {}
    if job.uses_sample:
        md5s = intact_sample(job.raw_dir, job.cache_file, sample_origin(job.sample))
        if md5s is None:
            return None
        records |= {name: _record("sample", job.raw_dir / name, md5, "sample") for name, md5 in md5s.items()}
    for name, source in job.fetched().items():
        dest, src = job.raw_dir / name, local_path(source, job.root)
        if not (dest.is_file() and src.is_file() and os.path.samefile(dest, src)):
            return None
        md5, seen = cached_md5(dest, job.cache_file)
        if md5 is None or seen == "dvc-state":  # the flow copies a DVC-state MD5 into its own cache first
            return None
        records[name] = _record(source, dest, md5, "local")
    return records


def _record(source: str, path: Path, md5: str, method: str) -> dict[str, Any]:
    return {"source": source, "bytes": path.stat().st_size, "md5": md5, "method": method}


def unchanged(job: Download) -> bool:
    """Whether the flow would find nothing to do and write the download.json that is there already."""
    raw = job.raw_dir
    if not (raw / download_json.FILE).is_file() or any(raw.glob(".*.tmp-*")):
        return False
    if archive21k.stale_tars(raw, set(job.sources), job.cache_file):
        return False
    records = stat_records(job)
    if records is None or download_json.stale_sample_table(raw, records):
        return False
    try:
        found = json.loads((raw / download_json.FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(found == download_json.archives_doc(job.source, records))


def exit_if_unchanged(params_file: str = "params.yaml") -> None:
    """Exit 0 (one line printed, no flow run) when the download stage has nothing to do; return otherwise, and on
    any error (the flow then runs and reports it)."""
    try:
        project = load_project(params_file)
        job = plan(project)
        if not unchanged(job):
            return
        claim_run(project.path("work"), "download")
    except Exception:  # bad params, a held run, an unreadable file: the flow runs and says what is wrong
        return
    names, record = ", ".join(sorted(job.sources)), job.raw_dir / download_json.FILE
    print(f"download: nothing to do: {names} unchanged since {record} (no flow run)")
    raise SystemExit(0)
