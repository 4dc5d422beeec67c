"""verify stage: every raw archive against the official MD5 table (or the built-in sample's own table).

An MD5 computed while downloading or linking (the download stage), or by an earlier verify / DVC, is reused when the
file is unchanged since (size, mtime_ns, inode — see tasks.acquire.md5state); otherwise the file is read once, the
train and val archives in the pass that also indexes their tar headers for the extract stage (its prescan:
tasks.common.archive_pass, used by extract only for the MD5 accepted here). A mismatch moves the file aside
to `<name>.corrupt` (so nothing downstream can read it; an older `.corrupt` is replaced, and removed once the
archive matches again); every archive is checked, then the stage fails naming each bad one with both MD5s and what
to do. `verify.json` is written only when every archive matched. In folder mode (download.json has `folder`) there
is no archive: verify.json carries the tree's digest, so the extract stage reruns when the tree changes. ImageNet-21k's
one archive (download.json has `archive21k`) is checked against a table when verify.checksums names one, else its MD5
is recorded and the output says that nothing was compared (tasks.acquire.archive21k)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tasks.acquire import archive21k
from tasks.acquire.archive21k import NOT_COMPARED
from tasks.acquire.md5state import archive_md5, forget_md5, prescan_dir
from tasks.acquire.sample import MD5_TABLE
from tasks.common import ARCHIVES, DATA_DIR, PipelineError, write_json
from tasks.common.archive21k import LAYOUT_KEY
from tasks.common.files import UnfitFile, read_small_text
from tasks.common.params import resolve_path

OFFICIAL_TABLE = DATA_DIR / "official_md5.tsv"


MAX_TABLE_BYTES = 1 << 20  # an MD5 table holds a handful of lines (the official one: 3)


def read_md5_table(path: Path) -> dict[str, str]:
    """A `name<TAB>md5` table with a header line (a regular file of at most MAX_TABLE_BYTES)."""
    try:
        lines = read_small_text(path, MAX_TABLE_BYTES).splitlines()
    except (OSError, UnfitFile) as err:
        found = "no such file" if isinstance(err, FileNotFoundError) else str(err)
        raise PipelineError(
            f"{path}: expected an MD5 table (name<TAB>md5, a regular file of at most {MAX_TABLE_BYTES:,} bytes), "
            f"found {found}. Set verify.checksums to auto, official, sample or an existing table."
        ) from None
    rows = [line.split("\t") for line in lines[1:] if line.strip()]
    if lines[:1] != ["name\tmd5"] or any(len(r) != 2 or len(r[1]) != 32 for r in rows):
        raise PipelineError(
            f"{path}: expected a header 'name<TAB>md5' then one '<archive><TAB><32 hex>' per "
            "line, found something else. Fix the table."
        )
    return {name: md5.lower() for name, md5 in rows}


def expected_md5s(checksums: str, raw_dir: Path, root: Path = Path(".")) -> tuple[str, dict[str, str | None]]:
    """(table kind, {archive name: expected md5}) for `verify.checksums`: auto | official | sample | <path>
    (relative to `root`, the project).

    Also removes a previous verify.json: only a run where every archive matched writes one."""
    (raw_dir / "verify.json").unlink(missing_ok=True)
    if _folder(raw_dir) is not None:
        return "none (folder mode)", {}
    entry = archive21k.recorded_layout(raw_dir)
    if entry is not None:
        return _expected_21k(checksums, raw_dir, root, entry)
    if checksums == "auto":
        download = raw_dir / "download.json"
        methods = (
            {r["method"] for r in json.loads(download.read_text())["archives"].values()} if download.exists() else set()
        )
        checksums = "sample" if methods == {"sample"} else "official"
    if checksums in ("official", "sample"):
        table = read_md5_table(OFFICIAL_TABLE if checksums == "official" else raw_dir / MD5_TABLE)
    else:
        table = read_md5_table(resolve_path(root, checksums))
    missing = sorted(set(ARCHIVES.values()) - set(table))
    if missing:
        raise PipelineError(
            f"{checksums} MD5 table: expected a row for {', '.join(missing)}, found rows for "
            f"{sorted(table)}. Add the missing rows or choose another verify.checksums."
        )
    return str(checksums), {name: table[name] for name in ARCHIVES.values()}


def _expected_21k(
    checksums: str, raw_dir: Path, root: Path, entry: dict[str, str]
) -> tuple[str, dict[str, str | None]]:
    """archive21k mode: the archive against a table (verify.checksums: a path), or nothing to compare with (auto)."""
    if checksums in ("official", "sample"):
        raise PipelineError(
            f"params.yaml verify.checksums: expected auto (no table: the MD5 is recorded, not compared) or a "
            f"name<TAB>md5 table with a row for {entry['archive']} in extract.mode: archive21k, found {checksums} "
            "(that table lists the ILSVRC2012 archives only)"
        )
    table = None if checksums == "auto" else read_md5_table(resolve_path(root, checksums))
    return (NOT_COMPARED if table is None else checksums), archive21k.expected_md5s(checksums, raw_dir, entry, table)


def archive_splits(raw_dir: Path) -> dict[str, str]:
    """Archive name -> the split its images belong to where the name does not say (archive21k's .tar: train)."""
    entry = archive21k.recorded_layout(raw_dir)
    return {entry["tar"]: "train"} if entry else {}


def _corrupt_path(path: Path) -> Path:
    return path.with_name(path.name + ".corrupt")


def quarantine(path: Path, cache_file: Path) -> Path:
    """Move a bad archive aside so nothing downstream can read it under its real name.

    An older `.corrupt` goes first: renaming one hard link onto another of the same file (a re-linked corrupt
    source) is a no-op in POSIX, which would leave the bad archive under its real name."""
    forget_md5(path, cache_file)
    corrupt = _corrupt_path(path)
    corrupt.unlink(missing_ok=True)
    os.replace(path, corrupt)
    if path.exists() or path.is_symlink():  # never claim "moved" while the real name still opens it
        raise PipelineError(f"{path}: expected to move this bad archive to {corrupt}, found it still there; delete it")
    return corrupt


def clear_quarantine(path: Path) -> None:
    """The archive matches now: a `.corrupt` left by an earlier run is no longer needed."""
    corrupt = _corrupt_path(path)
    if corrupt.exists() or corrupt.is_symlink():
        corrupt.unlink()
        print(f"{corrupt}: removed (the archive matches now)")


def check_archive(
    name: str,
    raw_dir: Path,
    expected: str | None,
    cache_file: Path,
    table: str,
    progress: bool = True,
    split: str | None = None,
) -> dict[str, Any]:
    """Verify one archive; returns its verify.json entry plus `md5_from` (not written to verify.json). An MD5 not
    known yet is computed in the pass that also indexes the archive for the extract stage (its prescan, under the
    same scratch directory as `cache_file`; `split`: see archive_splits). `expected` None: no table to compare
    with (archive21k mode without one): the MD5 is recorded, and said to be compared with nothing."""
    path = raw_dir / name
    if not path.is_file():
        raise PipelineError(
            f"{path}: expected the archive (from the download stage), found nothing"
            f"{' but a broken link' if path.is_symlink() else ''}. Run `dvc repro download` "
            "or fix download.source in params.yaml."
        )
    md5, origin = archive_md5(path, cache_file, prescan_dir(cache_file), "verify", progress, split)
    if expected is not None and md5 != expected:
        linked = f" (it is a link to {path.resolve()}: that copy is damaged)" if path.is_symlink() else ""
        size = path.stat().st_size
        corrupt = quarantine(path, cache_file)
        error = (
            f"{path}: expected MD5 {expected} ({table} table), found {md5}{linked}. The file was moved to {corrupt}."
        )
        return {"md5": md5, "expected": expected, "bytes": size, "ok": False, "md5_from": origin, "error": error}
    clear_quarantine(path)
    return {"md5": md5, "expected": expected, "bytes": path.stat().st_size, "ok": True, "md5_from": origin}


def write_verify_json(raw_dir: Path, table: str, results: dict[str, dict[str, Any]]) -> Path:
    """verify.json (docs/CONTRACTS.md) from check_archive's results; how each MD5 was obtained is only printed.
    Fails (writing nothing) naming every archive that did not match."""
    bad = [r["error"] for _name, r in sorted(results.items()) if not r["ok"]]
    if bad:
        raise PipelineError(
            f"{len(bad)} of {len(results)} archives do not match:\n"
            + "\n".join(f"  - {line}" for line in bad)
            + "\nDelete the .corrupt files and download the archive again (each one named above: re-run `dvc repro`), "
            "or point download.source at intact copies; with verify.checksums set to a table, check that table."
        )
    archives = {name: {k: v for k, v in r.items() if k != "md5_from"} for name, r in results.items()}
    for name, r in sorted(results.items()):
        how = "computed now" if r["md5_from"] == "computed" else f"reused: {r['md5_from']}"
        if r["expected"] is None:
            print(
                f"{name}: MD5 {r['md5']} ({how}) NOT COMPARED: there is no MD5 table (verify.checksums: auto); "
                "recorded in verify.json. Set verify.checksums to a name<TAB>md5 table to check the archive"
            )
        else:
            print(f"{name}: MD5 {r['md5']} matches the {table} table ({how})")
    folder, layout = _folder(raw_dir), archive21k.recorded_layout(raw_dir)
    extra = {"folder": folder} if folder is not None else {LAYOUT_KEY: layout} if layout else {}
    return write_json(raw_dir / "verify.json", {"archives": archives, "checksums": table, **extra})


def _folder(raw_dir: Path) -> dict[str, Any] | None:
    """download.json's `folder` entry (folder mode: the tree's digest), else None."""
    download = raw_dir / "download.json"
    if not download.is_file():
        return None
    folder: dict[str, Any] | None = json.loads(download.read_text(encoding="utf-8")).get("folder")
    return folder
