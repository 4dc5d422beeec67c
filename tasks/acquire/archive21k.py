"""ImageNet-21k's layout (params.yaml `extract.mode: archive21k`): ONE archive of per-class `<wnid>.tar` tars.

`download.archive` names it: a file name under `download.source`, or a path or URL of its own. A plain `.tar` is
linked (or downloaded) into paths.raw like the ILSVRC2012 archives, by the same acquire core (tasks.acquire.obtain,
which never imports this module), and hashed in the pass that indexes its nested tars (tasks.common.archive_pass, as
the ILSVRC2012 train archive). A `.tar.gz` / `.tgz` cannot be read at byte offsets, and convert reads every image by
offset: the download stage decompresses it ONCE into `<paths.raw>/<stem>.tar` (streamed in bounded blocks, written
under a temporary name then renamed; about as large as the .tar.gz, JPEGs do not compress), and every later stage
reads that .tar. download.json then records both files (the .tar with method `gunzip`) and an `archive21k` entry
naming them, which verify and extract follow.

Verify compares the archive as published with `verify.checksums` when it is a table; with `auto` there is no table
to compare with: the MD5 is computed, recorded, and verify says plainly that nothing was compared. The decompressed
.tar is checked against the MD5 the download stage recorded while writing it."""

from __future__ import annotations

import glob
import hashlib
import json
import shutil
import zlib
from pathlib import Path
from typing import IO, Any

from tasks.acquire.local import link_local, local_path
from tasks.acquire.md5state import cached_md5, forget_md5, remember_md5
from tasks.acquire.obtain import fetch_archive
from tasks.acquire.remote import FetchOptions, kind, redact, remote_size
from tasks.acquire.space import SPACE_MARGIN
from tasks.common import PipelineError, atomic_path
from tasks.common.archive21k import LAYOUT_KEY, published_name, tar_name
from tasks.common.files import remove_dead_temporaries
from tasks.common.params import DownloadParams
from tasks.common.progress import Progress

NOT_COMPARED = "none: no MD5 table (verify.checksums: auto), computed and recorded, not compared"


def archive_source(params: DownloadParams) -> dict[str, str]:
    """{published name: source}: download.archive itself when it is a path or URL, else `<source>/<name>`."""
    archive = params.archive
    assert archive is not None
    name = published_name(archive)
    if "/" in archive or "\\" in archive:
        return {name: archive}
    source = params.source
    if "://" in source:
        return {name: f"{source}{'' if source.endswith('/') else '/'}{name}"}
    return {name: str(Path(source) / name)}


# ---------------------------------------------------------------- the .tar.gz, decompressed once
def gunzip(gz: Path, tar: Path, chunk: int = 8 << 20, progress: bool = True) -> tuple[str, str, int]:
    """Decompress `gz` (every gzip member in turn) into `tar` via a temporary name: (MD5 of gz, MD5 of tar, tar
    bytes). Memory is bounded by `chunk` whatever the ratio; the bytes written are bounded by the free space (less
    the space check's margin) when it starts: a gzip bomb stops there, never fills the disk. A killed run's
    temporary file is removed first (a dead process's, never a live one's)."""
    digests = hashlib.md5(), hashlib.md5()
    written = 0
    _remove_dead_temporaries(tar)
    room = _room(tar.parent)
    bar = Progress(gz.stat().st_size, f"gunzip {gz.name}", enabled=progress)
    try:
        with open(gz, "rb") as fh, atomic_path(tar) as tmp, open(tmp, "wb") as out, bar:
            for block in _inflated(fh, gz, chunk, digests[0], bar):
                if written + len(block) > room:
                    raise _bomb(gz, tar, room)
                digests[1].update(block)
                out.write(block)
                written += len(block)
    except OSError as err:
        raise PipelineError(
            f"{tar}: expected to decompress {gz.name} into it, found {err}; nothing was written. The .tar needs "
            "about as much space as the .tar.gz (JPEGs do not compress): free space or point paths.raw at a larger "
            "disk, then run `dvc repro` again"
        ) from None
    return digests[0].hexdigest(), digests[1].hexdigest(), written


def _room(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    return max(0, shutil.disk_usage(directory).free - SPACE_MARGIN)


def _bomb(gz: Path, tar: Path, room: int) -> PipelineError:
    return PipelineError(
        f"{gz}: expected it to decompress into at most the {room:,} bytes free on {tar.parent} (less the "
        f"{SPACE_MARGIN >> 20} MiB margin; a .tar.gz of JPEGs inflates to about its own size, {gz.stat().st_size:,} "
        "bytes), found more than that (a gzip bomb, or not an archive of JPEGs); nothing was written. Check that "
        "download.archive names the right file, or free space on paths.raw if it really is that large"
    )


def _remove_dead_temporaries(tar: Path) -> None:
    """Remove `.<tar>.tmp-<pid>` files of processes no longer running: a kill -9 mid-decompression leaves one as
    large as what was written (up to the whole .tar: 1.3 TB at 21k); removed before the space check counts room."""
    for tmp in remove_dead_temporaries(tar.parent, glob.escape(tar.name)):
        print(f"{tmp}: removed (left by a decompression that was killed, process {tmp.name.rsplit('-', 1)[1]})")


def _inflated(fh: IO[bytes], gz: Path, chunk: int, md5: Any, bar: Progress) -> Any:
    """The decompressed bytes of `fh` in blocks of at most `chunk`; a damaged or truncated stream fails naming gz."""
    inflater, pending, fed = zlib.decompressobj(31), b"", False
    try:
        while True:
            if not pending:
                pending = fh.read(chunk)
                md5.update(pending)
                bar.update(len(pending))
                if not pending:
                    break
            fed = True
            yield inflater.decompress(pending, chunk)
            pending = inflater.unconsumed_tail
            if inflater.eof:  # the next gzip member, if any (unused_data: all the input after this one's end)
                pending, inflater, fed = inflater.unused_data, zlib.decompressobj(31), False
    except zlib.error as err:
        raise _damaged(gz, f"damaged gzip data ({err})") from None
    if fed and not inflater.eof:
        raise _damaged(gz, "a gzip stream that ends early (truncated)")


def _damaged(gz: Path, found: str) -> PipelineError:
    return PipelineError(
        f"{gz}: expected a complete gzip stream of a tar, found {found}; nothing was written. Download the "
        "archive again (delete it from paths.raw) or point download.archive at an intact copy"
    )


def decompressed(gz: Path, cache_file: Path, chunk: int = 8 << 20, progress: bool = True) -> tuple[dict[str, Any], str]:
    """The .tar of `gz` (download.json record) and gz's MD5: reused while both files are unchanged since the
    last decompression, else decompressed now (once; both MD5s remembered by stat)."""
    tar = gz.with_name(tar_name(gz.name))
    kept = _kept(gz, cache_file)
    if kept is not None:
        gz_md5, tar_md5 = kept
    else:
        gz_md5, tar_md5, size = gunzip(gz, tar, chunk, progress)
        remember_md5(gz, gz_md5, cache_file, "gunzip")
        remember_md5(tar, tar_md5, cache_file, _origin(gz_md5))
        print(
            f"{gz.name}: decompressed once into {tar} ({size:,} bytes, about the .tar.gz's size: JPEGs do not "
            "compress); every later stage reads the .tar by offset"
        )
    record = {"source": gz.name, "bytes": tar.stat().st_size, "md5": tar_md5, "method": "gunzip"}
    return record, gz_md5


def _kept(gz: Path, cache_file: Path) -> tuple[str, str] | None:
    """(gz's MD5, the .tar's MD5) while the .tar decompressed from gz earlier is there and both are unchanged."""
    tar = gz.with_name(tar_name(gz.name))
    gz_md5, _ = cached_md5(gz, cache_file)
    if gz_md5 is None or not tar.is_file():
        return None
    tar_md5, origin = cached_md5(tar, cache_file)
    return (gz_md5, tar_md5) if tar_md5 and origin == _origin(gz_md5) else None


def _origin(gz_md5: str) -> str:
    return f"gunzip of {gz_md5}"


def decompression_space(
    name: str, source: str, raw_dir: Path, opts: FetchOptions, cache_file: Path, root: Path = Path(".")
) -> dict[str, int]:
    """The free space the .tar of a .tar.gz needs (for the download stage's check before anything is written):
    about the .tar.gz's size (JPEGs do not compress), nothing while an earlier decompression is still intact."""
    if _kept(raw_dir / name, cache_file) is not None:
        return {}
    size = local_path(source, root).stat().st_size if kind(source) == "local" else remote_size(source, opts) or 0
    return {f"{tar_name(name)} (decompressed from {name}, about as large)": size}


def fetch_gzipped(
    name: str, source: str, raw_dir: Path, opts: FetchOptions, cache_file: Path, root: Path = Path(".")
) -> dict[str, dict[str, Any]]:
    """Bring a .tar.gz to raw_dir (linked, or downloaded), then its .tar (decompressed once): both records. A
    linked one is hashed in the decompression's read (one pass); a downloaded one was hashed on the way in."""
    gz = raw_dir / name
    if kind(source) == "local":
        link = link_local(source, gz, root)
        tar, md5 = decompressed(gz, cache_file, opts.chunk_bytes, opts.progress)
        record = {"source": source, "bytes": gz.stat().st_size, "md5": md5, "method": "local", "link": link}
        return {name: record, tar_name(name): tar}
    record = fetch_archive(name, source, raw_dir, opts, cache_file, root)
    tar, md5 = decompressed(gz, cache_file, opts.chunk_bytes, opts.progress)
    if md5 != record["md5"]:
        raise PipelineError(
            f"{gz}: expected the MD5 {record['md5']} computed while downloading {redact(source)}, found {md5} when "
            "decompressing it (the file changed in between); run `dvc repro` again"
        )
    return {name: record, tar_name(name): tar}


# ---------------------------------------------------------------- an earlier archive's .tar
def remove_stale_tars(raw_dir: Path, keep: set[str], cache_file: Path) -> list[str]:
    """Remove from raw_dir every .tar the download stage decompressed from an earlier download.archive (`keep`: the
    files this run brings). Ours alone (download.json's `gunzip` records, or the MD5 cache while the file is as it
    was written), never a linked or downloaded archive; removed before the space check, so its room counts."""
    removed = []
    for name, origin in stale_tars(raw_dir, keep, cache_file).items():
        path = raw_dir / name
        size = path.stat().st_size
        path.unlink()
        forget_md5(path, cache_file)
        removed.append(name)
        print(
            f"{path}: removed ({size:,} bytes), decompressed from {origin} for an earlier download.archive that "
            "params.yaml no longer names (naming it again decompresses it again)"
        )
    return removed


def stale_tars(raw_dir: Path, keep: set[str], cache_file: Path) -> dict[str, str]:
    """The .tar files `remove_stale_tars` removes (name -> the archive it was decompressed from), sorted."""
    return {
        name: origin
        for name, origin in sorted(_decompressed_here(raw_dir, cache_file).items())
        if name not in keep and not (raw_dir / name).is_symlink() and (raw_dir / name).is_file()
    }


def _decompressed_here(raw_dir: Path, cache_file: Path) -> dict[str, str]:
    """{name of a .tar in raw_dir the download stage wrote by decompressing: the .tar.gz it came from}."""
    try:
        records = json.loads((raw_dir / "download.json").read_text(encoding="utf-8"))["archives"]
        found = {n: str(r["source"]) for n, r in records.items() if r.get("method") == "gunzip"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        found = {}
    for path in raw_dir.glob("*.tar") if raw_dir.is_dir() else ():
        if path.name not in found and cached_md5(path, cache_file)[1].startswith(_origin("")):
            found[path.name] = "a .tar.gz"
    return found


# ---------------------------------------------------------------- verify
def recorded_layout(raw_dir: Path, file: str = "download.json") -> dict[str, str] | None:
    """The `archive21k` entry of download.json (or verify.json), None for the other modes."""
    try:
        entry: dict[str, str] | None = json.loads((raw_dir / file).read_text(encoding="utf-8")).get(LAYOUT_KEY)
    except (OSError, ValueError):
        return None
    return entry


def expected_md5s(
    checksums: str, raw_dir: Path, entry: dict[str, str], table: dict[str, str] | None
) -> dict[str, str | None]:
    """{file: the MD5 it must have, None: nothing to compare with}: the published archive against `table`
    (verify.checksums' rows; None with auto), a decompressed .tar against the MD5 download recorded writing it."""
    archive, tar = entry["archive"], entry["tar"]
    if table is not None and archive not in table:
        raise PipelineError(
            f"{checksums} MD5 table: expected a row for {archive} (download.archive), found rows for {sorted(table)}. "
            "Add its row, or set verify.checksums: auto (the MD5 is then recorded, not compared)"
        )
    expected: dict[str, str | None] = {archive: table[archive] if table is not None else None}
    if tar != archive:
        records = json.loads((raw_dir / "download.json").read_text(encoding="utf-8"))["archives"]
        expected[tar] = (table or {}).get(tar) or records[tar]["md5"]
    return expected
