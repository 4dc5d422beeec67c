"""Optional ImageFolder tree (`train/<wnid>/<name>`, `val/<wnid>/<name>`) written from the manifests.

Files are written by tarfile's own extraction with the `data` filter (so nothing can land outside the tree,
links and devices are refused, permissions are sanitised); the filter then renames each member to
`<wnid>/<name>`. The whole tree is built under a temporary name and renamed into place at the end. The tree is
not a DVC output: DVC would otherwise hash every one of its files on every `dvc repro`."""

from __future__ import annotations

import os
import re
import tarfile
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tasks.common import SPLITS, PipelineError, atomic_path
from tasks.common.manifests import manifest_path
from tasks.common.tarindex import TAR_ENCODING, open_tar, safe_members

CLASS_TAR_PREFIX = re.compile(r"^(.*?n\d{8}\.tar)/")  # `<...>/n01440764.tar/<image>` → the class tar member
Targets = dict[tuple[str, int], str]  # (member path, offset in the archive) → relative target path


def _rename_filter(target: str) -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo]:
    """tarfile's `data` filter, then the member renamed to `target` (a checked `<wnid>/<name>`)."""

    def _filter(info: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
        return tarfile.data_filter(info, dest).replace(name=target, deep=False)

    return _filter


def _extract_members(
    tar: tarfile.TarFile, archive: str, limit: int, targets: Targets, dest: Path, prefix: str = "", base: int = 0
) -> int:
    done = 0
    for info in safe_members(tar, archive, limit):
        target = targets.get((prefix + info.name, base + info.offset_data))
        if target is None or not info.isreg():
            continue
        try:
            tar.extract(info, dest, filter=_rename_filter(target))
        except tarfile.FilterError as err:
            raise PipelineError(f"{archive}: refused member {info.name!r} ({err}); use the official archive") from None
        done += 1
    return done


def _extract_archive(archive: Path, nested: bool, targets: Targets, dest: Path) -> int:
    limit = os.path.getsize(archive)
    with open_tar(archive) as outer:
        if not nested:
            return _extract_members(outer, str(archive), limit, targets, dest)
        wanted = {match.group(1) for member, _ in targets if (match := CLASS_TAR_PREFIX.match(member))}
        done = 0
        for inner in safe_members(outer, str(archive), limit):
            if inner.isreg() and inner.name in wanted:
                with tarfile.open(fileobj=outer.extractfile(inner), mode="r:", **TAR_ENCODING) as tar:
                    done += _extract_members(
                        tar,
                        f"{archive} member {inner.name}",
                        inner.size,
                        targets,
                        dest,
                        prefix=inner.name + "/",
                        base=inner.offset_data,
                    )
        return done


def _targets(rows: list[dict[str, Any]], manifest: Path) -> dict[str, Targets]:
    """Per source archive: which member goes where. Two images with one target would overwrite: refused."""
    clashes = [t for t, n in Counter(f"{r['wnid']}/{r['name']}" for r in rows).items() if n > 1]
    if clashes:
        raise PipelineError(
            f"{manifest}: expected unique <wnid>/<name> paths for the ImageFolder tree, found "
            f"{len(clashes)} used twice (e.g. {clashes[:5]}); set extract.materialize: false "
            "(the manifest keeps every image) or remove the duplicates from the archive"
        )
    by_source: dict[str, Targets] = defaultdict(dict)
    for r in rows:
        if not r["member"]:
            raise PipelineError(
                f"{manifest}: expected archive members, found the plain file {r['source']} "
                "(folder mode): the input already is an ImageFolder tree; set materialize: false"
            )
        by_source[r["source"]][(r["member"], r["offset"])] = f"{r['wnid']}/{r['name']}"
    return by_source


def materialize(
    manifests_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], root: str | os.PathLike[str] = "."
) -> dict[str, int]:
    """Write `<out_dir>/{train,val}/<wnid>/<name>` for every manifest row, atomically; return files per split."""
    written: dict[str, int] = {}
    with atomic_path(out_dir) as tmp:
        for split in SPLITS:
            manifest = manifest_path(manifests_dir, split)
            rows = pq.read_table(manifest).to_pylist()
            written[split] = 0
            for source, targets in sorted(_targets(rows, manifest).items()):
                done = _extract_archive(Path(root) / source, split == "train", targets, tmp / split)
                if done != len(targets):
                    raise PipelineError(
                        f"{source}: expected the {len(targets)} images its manifest lists, found "
                        f"{done} at the recorded offsets; the archive changed: run `dvc repro` again"
                    )
                written[split] += done
    return written
