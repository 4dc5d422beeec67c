"""Each shard's byte findings kept between validate runs, so that a curation-only change reads no image byte.

`scan_bytes` (tasks.validate.scan) reads every shard's image bytes once: JPEG SOI, SHA-256 against the column, the
footer's byte index, a Pillow decode of the sampled rows. What that finds depends only on the shard's bytes and on
what the metadata frame expects of its rows, so each shard's findings (rows as offsets within the shard) are kept
in scratch space, `<paths.work>/validate/scan/<split>/<shard>.json` (not a DVC output), under a key:

* the shard as it is on disk: name, size, mtime_ns and inode (the trust the download stage's MD5 reuse gives a
  file, tasks.acquire.md5state) and the SHA-256 of its footer;
* the inputs of the check for its rows: a digest of the sha256 and width × height the metadata frame gives them
  and of their decode flags; the scanner's version and Pillow's (its messages are in the report).

Any difference — or a cache file that is missing, unreadable or malformed — and the shard is scanned again. The
findings are the same as a full scan's, so the report is byte-identical whichever shards came from here.

The decode sample (`decode_mask`) is drawn so that curation moves it little: excluding a row outside it changes
nothing, excluding a sampled row brings in one other — only the shards of those rows are scanned again."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import PIL

from imagenet_parquet.format import FormatError
from imagenet_parquet.overlay import footer_digest, footer_tail
from tasks.common import SPLITS, write_json
from tasks.common.files import UnfitFile, read_small_text
from tasks.validate.shard_bytes import ByteFindings, ShardScan

SCANNER_VERSION = 1  # bump when scan_shard's checks or messages change: every kept finding is then rescanned
SCAN_DIR = "scan"  # under the validate work directory
ROW_FINDINGS = ("not_jpeg", "hash_mismatch", "undecodable", "index_mismatch")
MAX_BYTES = 256 << 20  # a cache file larger than this is not one this module wrote for a shard


class ScanCache:
    """The kept findings under `directory` (`<paths.work>/validate/scan`)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def file(self, job: ShardScan) -> Path:
        return self.directory / job.split / f"{job.path.name}.json"

    def key(self, job: ShardScan) -> dict[str, Any] | None:
        """What the findings of `job` depend on, read before its bytes are; None when the shard cannot be keyed
        (it is then scanned, and what is wrong with it reported by the scan)."""
        try:
            st = os.stat(job.path)
            footer = footer_digest(footer_tail(job.path))
        except (OSError, FormatError):
            return None
        return {
            "scanner": SCANNER_VERSION,
            "pillow": PIL.__version__,
            "split": job.split,
            "name": job.path.name,
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "inode": st.st_ino,
            "footer_sha256": footer,
            "rows": job.rows,
            "inputs_sha256": inputs_digest(job),
        }

    def load(self, job: ShardScan, key: dict[str, Any] | None) -> ByteFindings | None:
        """The kept findings of `job` (rows of the combined frame), or None: no file, another key, not readable."""
        if key is None:
            return None
        try:
            doc = json.loads(read_small_text(self.file(job), MAX_BYTES))
        except (OSError, UnfitFile, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("key") != key:
            return None
        part = parse_findings(doc.get("findings"), job.rows)
        return shifted(part, job.first) if part is not None else None

    def store(self, job: ShardScan, key: dict[str, Any] | None, found: ByteFindings) -> None:
        """Keep `found` (rows of the combined frame) for `job` under the `key` read before its scan."""
        if key is not None:
            findings = as_json(shifted(found, -job.first))
            write_json(self.file(job), {"key": key, "findings": findings}, key="paths.work")

    def prune(self, jobs: list[ShardScan]) -> None:
        """Remove the kept findings of shards no longer listed (a new conversion's names)."""
        kept = {self.file(job) for job in jobs}
        for path in sorted(self.directory.glob("*/*.json")):
            if path not in kept:
                path.unlink(missing_ok=True)


def inputs_digest(job: ShardScan) -> str:
    """SHA-256 of what the metadata frame expects of the shard's rows: sha256, width × height, decode flag."""
    digest = hashlib.sha256()
    digest.update(repr(np.asarray(job.sha).tolist()).encode())
    digest.update(b"\0" + repr(np.asarray(job.size).tolist()).encode())
    digest.update(b"\0" + np.asarray(job.decode, dtype=bool).tobytes())
    return digest.hexdigest()


def shifted(found: ByteFindings, delta: int) -> ByteFindings:
    """`found` with every row moved by `delta` (shard offsets ↔ rows of the combined frame), order kept."""
    moved = {name: {row + delta: text for row, text in getattr(found, name).items()} for name in ROW_FINDINGS}
    return ByteFindings(
        **moved, unindexed=list(found.unindexed), decoded=dict(found.decoded), image_bytes=dict(found.image_bytes)
    )


def as_json(found: ByteFindings) -> dict[str, Any]:
    """Findings as JSON: row findings as [row, text] pairs in the order found (the report lists them so)."""
    doc: dict[str, Any] = {name: [[row, text] for row, text in getattr(found, name).items()] for name in ROW_FINDINGS}
    return {**doc, "unindexed": found.unindexed, "decoded": found.decoded, "image_bytes": found.image_bytes}


def parse_findings(doc: object, rows: int) -> ByteFindings | None:
    """`as_json`'s output back (rows within [0, rows)), or None when it is anything else."""
    if not isinstance(doc, dict) or set(doc) != {*ROW_FINDINGS, "unindexed", "decoded", "image_bytes"}:
        return None
    found = ByteFindings()
    for name in ROW_FINDINGS:
        pairs = doc[name]
        if not isinstance(pairs, list) or not all(_row_pair(p, rows) for p in pairs):
            return None
        getattr(found, name).update((row, text) for row, text in pairs)
        if len(getattr(found, name)) != len(pairs):  # a row twice: not what as_json wrote
            return None
    if not isinstance(doc["unindexed"], list) or not all(isinstance(s, str) for s in doc["unindexed"]):
        return None
    found.unindexed = list(doc["unindexed"])
    for name in ("decoded", "image_bytes"):
        counts = doc[name]
        if not isinstance(counts, dict) or not all(_count(v) for v in counts.values()):
            return None
        setattr(found, name, dict(counts))
    return found


def _row_pair(pair: object, rows: int) -> bool:
    return isinstance(pair, list) and len(pair) == 2 and _count(pair[0]) and pair[0] < rows and isinstance(pair[1], str)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def decode_mask(meta: pd.DataFrame, sample: int | float | str, seed: int = 0) -> np.ndarray:
    """Deterministic per-split sample of rows to decode (a count, a fraction in (0, 1], or "all"): the rows with
    the smallest `sample_keys`. Stable under curation: excluding a row outside the sample leaves the sample as it
    is, excluding a sampled row brings in the next one (and only the shards of those rows are scanned again)."""
    mask = np.zeros(len(meta), dtype=bool)
    keys = sample_keys(meta, seed)
    for split in SPLITS:
        rows = np.flatnonzero((meta["split"] == split).to_numpy())
        count = sample_size(len(rows), sample)
        mask[rows[np.argsort(keys[rows], kind="stable")[:count]]] = True
    return mask


def sample_keys(meta: pd.DataFrame, seed: int = 0) -> np.ndarray:
    """A keyed 64-bit hash of each row's (split, shard name, row in the shard), the same whatever other rows the
    frame holds: BLAKE2b of `split/shard` keyed by `seed`, mixed with the row (splitmix64's finalizer)."""
    split_codes, splits = pd.factorize(meta["split"])
    shard_codes, names = pd.factorize(meta["shard"])
    width = max(len(names), 1)
    codes, pairs = pd.factorize(split_codes.astype(np.int64) * width + shard_codes)
    salt = np.array([_keyed(f"{splits[p // width]}/{names[p % width]}", seed) for p in pairs], dtype=np.uint64)
    rows = meta["row"].to_numpy(dtype=np.uint64)
    return _mix(salt[codes] ^ _mix(rows))


def _keyed(text: str, seed: int) -> int:
    digest = hashlib.blake2b(text.encode(), digest_size=8, key=seed.to_bytes(8, "little", signed=True))
    return int.from_bytes(digest.digest(), "little")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over uint64 (wrapping arithmetic): every input bit moves every output bit."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def sample_size(rows: int, sample: int | float | str) -> int:
    """How many of `rows` to decode for the `decode_sample` param (checked by tasks.common.params)."""
    if sample == "all":
        return rows
    if isinstance(sample, float):
        return min(rows, int(np.ceil(sample * rows)))
    return min(rows, int(sample))
