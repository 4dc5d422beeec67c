"""Each shard's metadata columns, kept in validate's scratch space while the shard is unchanged.

Validate reads eleven small columns of every shard (tasks/validate/scan.py: `read_metadata`). Shards hold a row
group per ~100 images (what the reader's random access needs), so that read decodes ~11,000 column chunks per
column at ImageNet-1k: ~3.1 CPU-s for 1.33 M rows, against 0.15 s for the same table read back from one Arrow IPC
file (zstd, ~60 B a row). A curation round changes no shard, an append adds a few: each shard's table is kept in
`<paths.work>/validate/metadata/<split>/<shard>.arrow` under a key read before the shard is — its name, size, mtime,
inode and footer SHA-256 (the key of the byte findings, tasks/validate/scan.py), the layout version and pyarrow's
version — stored in the file's schema metadata. A file with another key, one that does not parse, is larger than
MAX_BYTES or holds another row count is never used: the shard is read and the file written again (atomically)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from imagenet_parquet.format import FormatError
from imagenet_parquet.overlay import footer_digest, footer_tail
from tasks.common.files import atomic_path

METADATA_DIR = "metadata"  # under the validate work directory
LAYOUT_VERSION = 1  # bump when what `read_metadata` makes of a shard changes
KEY = b"imagenet_parquet.validate_kept"
MAX_BYTES = 1 << 30  # larger: not a file this module wrote for one shard

Loader = Callable[[Path, "pq.FileMetaData | None"], "tuple[pa.Table, pq.FileMetaData]"]


class KeptMetadata:
    """The kept tables under `directory` (`<paths.work>/validate/metadata`; None: nothing kept, every shard read)."""

    def __init__(self, directory: str | os.PathLike[str] | None) -> None:
        self.directory = Path(directory) if directory is not None else None

    def read(self, split: str, path: Path, load: Loader) -> tuple[pa.Table, pq.FileMetaData]:
        """Shard `path`'s metadata table and footer: kept, or `load(path, footer)` (None when the footer did not
        parse: `load` then names what is wrong with the file) and kept for the next run."""
        try:
            tail = footer_tail(path)
            footer = pq.read_metadata(pa.BufferReader(b"PAR1" + tail))  # the tail holds the footer, its length, PAR1
        except (OSError, FormatError, pa.ArrowException):
            return _plain(*load(path, None))
        if self.directory is None:
            return _plain(*load(path, footer))
        kept, key = self.file(split, path), _key(path, tail)
        table = _read_kept(kept, key, footer.num_rows) if key is not None else None
        if table is not None:
            return table, footer
        table, footer = _plain(*load(path, footer))
        if key is not None:
            _write_kept(kept, key, table)
        return table, footer

    def file(self, split: str, path: Path) -> Path:
        assert self.directory is not None
        return self.directory / split / f"{path.name}.arrow"

    def prune(self, listed: dict[str, list[Path]]) -> None:
        """Remove the tables of shards no longer listed (`list_shards`: split -> shard paths)."""
        if self.directory is None:
            return
        kept = {self.file(split, path) for split, paths in listed.items() for path in paths}
        for found in sorted(self.directory.glob("*/*.arrow")):
            if found not in kept:
                found.unlink(missing_ok=True)


def _plain(table: pa.Table, footer: pq.FileMetaData) -> tuple[pa.Table, pq.FileMetaData]:
    """The table without the shard's key-value metadata (the same whether read or kept)."""
    return table.replace_schema_metadata(None), footer


def shard_identity(path: Path, tail: bytes | None = None) -> dict[str, Any] | None:
    """The key every result validate keeps for a shard starts from (the byte findings, the converted checks, the
    metadata table): its name, size, mtime, inode and footer SHA-256 (`tail`: its footer tail, already read).
    None when the file cannot be stat'ed or its footer read: nothing is then kept or reused for it."""
    try:
        st = os.stat(path)
        footer = footer_digest(tail if tail is not None else footer_tail(path))
    except (OSError, FormatError):
        return None
    return {
        "name": path.name,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "inode": st.st_ino,
        "footer_sha256": footer,
    }


def _key(path: Path, tail: bytes) -> dict[str, Any] | None:
    identity = shard_identity(path, tail)
    return None if identity is None else {"layout": LAYOUT_VERSION, "pyarrow": pa.__version__, **identity}


def _read_kept(kept: Path, key: dict[str, Any], rows: int) -> pa.Table | None:
    try:
        if kept.stat().st_size > MAX_BYTES:
            return None
        with pa.OSFile(str(kept)) as source:
            reader = pa.ipc.open_file(source)
            if json.loads((reader.schema.metadata or {}).get(KEY, b"null")) != key:
                return None
            table = reader.read_all()
    except (OSError, ValueError, pa.ArrowException):
        return None
    if table.num_rows != rows:
        return None
    return table.replace_schema_metadata(None)


def _write_kept(kept: Path, key: dict[str, Any], table: pa.Table) -> None:
    schema = table.schema.with_metadata({KEY: json.dumps(key, sort_keys=True).encode()})
    with atomic_path(kept, key="paths.work") as tmp:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema, options=options) as writer:
            writer.write_table(table.replace_schema_metadata(schema.metadata))
