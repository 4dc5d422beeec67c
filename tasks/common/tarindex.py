"""Safe, read-only indexing of uncompressed tar archives: where each image's bytes lie, without extracting.

The ILSVRC2012 train archive is a tar of 1000 uncompressed per-class tars. An inner tar member `m` opened
through `outer.extractfile(inner)` starts at `inner.offset_data` in the outer file, so the image bytes of `m`
lie at `inner.offset_data + m.offset_data` in the outer file: one `pread` reads them. Only the 512-byte headers
are read; tarfile seeks over the data.

Every member is checked before it is used: absolute paths, `..`, links, devices/FIFOs, sparse members and
sizes that run past the end of the (inner) archive are refused with an error naming the archive and member.

The per-class tars of a nested archive (ILSVRC2012's train archive, ImageNet-21k's one archive) are checked as a
whole once they are indexed (`ClassTar`, `class_tar_reports`): a class tar without an image is reported (as folder
mode reports an empty class folder); a class in two or more tars (the same `<wnid>.tar` twice, or in two folders) is
a reported merge — unless an image name is in two of them: which copy is meant is then unknowable, and keeping one
silently is not an option."""

from __future__ import annotations

import os
import re
import tarfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import IO, Literal, TypedDict

from tasks.common import PipelineError
from tasks.common.progress import Progress

ReadMode = Literal["r", "r:*", "r:", "r:gz", "r:bz2", "r:xz"]  # tarfile.open's random-access read modes


class _NameDecoding(TypedDict):
    """tarfile.open's member-name decoding arguments."""

    encoding: str
    errors: str


IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")  # compared case-insensitively
CLASS_TAR = re.compile(r"^(n\d{8})\.tar$")
# member names: undecodable bytes survive, get reported
TAR_ENCODING: _NameDecoding = {"encoding": "utf-8", "errors": "surrogateescape"}
NOT_UTF8 = "name is not valid UTF-8 (cannot be stored in the manifest)"
NOT_IMAGE = f"not an image (extension not one of {', '.join(IMAGE_EXTENSIONS)})"


@dataclass(frozen=True, slots=True)
class Entry:
    """One image inside an archive: `member` is its path there (`<inner>.tar/<name>` when nested)."""

    wnid: str  # "" when the archive does not tell (val)
    name: str
    member: str
    offset: int
    size: int


def printable(name: str) -> str:
    """A name as text even when its bytes are not valid UTF-8 (those bytes shown as \\xNN)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def report(split: str, source: str, member: str, reason: str, action: str = "skipped") -> dict[str, str]:
    """One entry of extract_report.json."""
    return {"split": split, "source": source, "member": printable(member), "reason": reason, "action": action}


def _refuse(archive: str, member: str, why: str) -> PipelineError:
    return PipelineError(
        f"{archive}: refused member {printable(member)!r}: {why}. Expected only regular files and directories "
        "with relative paths that fit inside the archive. The archive is damaged or not the official one: "
        "replace it with the official file (or fix it) and run `dvc repro` again."
    )


def check_member(archive: str, info: tarfile.TarInfo, limit: int | None) -> None:
    """Refuse a member that could write outside a target directory or that lies about its size.

    `limit` = bytes of the (uncompressed) archive; None for a compressed stream (the caller bounds sizes)."""
    name = info.name
    if info.issym() or info.islnk():
        kind = "symbolic" if info.issym() else "hard"
        raise _refuse(archive, name, f"it is a {kind} link to {printable(info.linkname)!r}")
    if info.ischr() or info.isblk() or info.isfifo():
        raise _refuse(archive, name, "it is a device or FIFO")
    if info.issparse() or not (info.isreg() or info.isdir()):
        raise _refuse(archive, name, f"unsupported member type {info.type!r}")
    if name.startswith(("/", "\\")) or PureWindowsPath(name).drive:
        raise _refuse(archive, name, "it has an absolute path")
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        raise _refuse(archive, name, "its path contains '..'")
    if info.size < 0 or (limit is not None and info.offset_data + info.size > limit):
        raise _refuse(
            archive,
            name,
            f"it declares {info.size} bytes at offset {info.offset_data}, but the archive holds only {limit} bytes",
        )


def safe_members(tar: tarfile.TarFile, archive: str, limit: int | None) -> Iterator[tarfile.TarInfo]:
    """The members of `tar` in archive order, each checked (see check_member). tarfile keeps every TarInfo it read
    (`tar.members`, ~330 B each: 66 MB for a class tar of 200,000 images); nothing here reads them back, so they
    are let go as the walk goes."""
    while True:
        tar.members.clear()  # type: ignore[attr-defined]  # (a plain list attribute; typeshed omits it)
        try:
            info = tar.next()
        except tarfile.TarError as err:
            raise PipelineError(
                f"{archive}: expected a readable tar archive, found a damaged header ({err}); "
                "replace the file with the official archive and run `dvc repro` again"
            ) from None
        if info is None:
            return
        check_member(archive, info, limit)
        yield info


def classify(split: str, source: str, info: tarfile.TarInfo, member: str) -> dict[str, str] | None:
    """None when the member is an image to index, else the report entry saying why it is skipped."""
    if not is_utf8(info.name):
        return report(split, source, member, NOT_UTF8)
    if not is_image(info.name):
        return report(split, source, member, NOT_IMAGE)
    return None


def collisions(split: str, source: str, members: Iterable[str]) -> list[dict[str, str]]:
    """Report names of one container that are equal after case-folding (all of them are kept)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for member in members:
        groups[member.casefold()].append(member)
    return [
        report(
            split,
            source,
            " | ".join(sorted(names)),
            f"{len(names)} names collide after case-folding",
            action="kept all",
        )
        for _, names in sorted(groups.items())
        if len(names) > 1
    ]


def _index_members(
    tar: tarfile.TarFile,
    archive: str,
    limit: int,
    split: str,
    source: str,
    wnid: str,
    prefix: str = "",
    base: int = 0,
    bar: Progress | None = None,
) -> tuple[list[Entry], list[dict[str, str]]]:
    entries: list[Entry] = []
    reported: list[dict[str, str]] = []
    for info in safe_members(tar, archive, limit):
        if bar is not None:
            bar.update(info.offset_data + info.size - bar.done)
        if info.isdir():
            continue
        member = prefix + info.name
        skip = classify(split, source, info, member)
        if skip:
            reported.append(skip)
            continue
        name = PurePosixPath(info.name).name
        entries.append(Entry(wnid, name, member, base + info.offset_data, info.size))
    reported += collisions(split, source, [e.member for e in entries])
    return entries, reported


def open_tar(path: str | os.PathLike[str], mode: ReadMode = "r:", fileobj: IO[bytes] | None = None) -> tarfile.TarFile:
    """tarfile.open with the project's name decoding (reading `fileobj` when given, else the file); an unreadable
    file fails naming it."""
    try:
        return tarfile.open(path, mode, fileobj, **TAR_ENCODING)
    except (tarfile.TarError, OSError, EOFError) as err:
        raise PipelineError(
            f"{path}: expected a readable tar archive, found {err}; replace it with the "
            "official file (or point params.yaml at the right one) and run `dvc repro` again"
        ) from None


def index_tar(
    path: str | os.PathLike[str], split: str, source: str, fileobj: IO[bytes] | None = None, size: int | None = None
) -> tuple[list[Entry], list[dict[str, str]]]:
    """Index a flat tar (the val archive): one Entry per image member, plus report entries. With `fileobj` (the
    file's bytes through another reader, e.g. tasks.common.archive_pass) it shows no progress of its own; `size`:
    the file's size when it is not on disk yet (a download)."""
    size = os.path.getsize(path) if size is None else size
    with open_tar(path, fileobj=fileobj) as tar, _scan_bar(path, size, fileobj) as bar:
        return _index_members(tar, str(path), size, split, source, wnid="", bar=bar)


def _scan_bar(path: str | os.PathLike[str], size: int, fileobj: IO[bytes] | None) -> Progress:
    return Progress(size, f"tar scan {Path(path).name}", enabled=fileobj is None)


# ---------------------------------------------------------------- the per-class tars of a nested archive
@dataclass(frozen=True, slots=True)
class ClassTar:
    """One `<wnid>.tar` of the archive: its member name and the slice of the index its images took."""

    wnid: str
    member: str
    start: int
    end: int


def class_tar_reports(
    archive: str, split: str, source: str, tars: list[ClassTar], entries: Sequence[Entry]
) -> list[dict[str, str]]:
    """extract_report.json entries for empty class tars and merged duplicates; PipelineError naming the archive
    when a duplicated class has an image name in two of its tars."""
    copies: dict[str, list[ClassTar]] = {}
    for tar in tars:
        copies.setdefault(tar.wnid, []).append(tar)
    reported = []
    for wnid, same in copies.items():
        images = sum(t.end - t.start for t in same)
        absent = f"class {wnid} counts as absent from {split}"
        for tar in (t for t in same if t.end == t.start):
            action = f"no image of class {wnid} from this copy" if images else absent
            reported.append(report(split, source, tar.member, "empty class tar (no images)", action))
        if len(same) > 1:
            _refuse_shared_names(archive, wnid, same, entries)
            members = " | ".join(t.member for t in same)
            why = f"class {wnid} in {len(same)} class tars (a duplicate <wnid>.tar)"
            merged = f"merged: the {images} images of all {len(same)} kept (no name in two of them)"
            reported.append(report(split, source, members, why, merged))
    return reported


def _refuse_shared_names(archive: str, wnid: str, same: list[ClassTar], entries: Sequence[Entry]) -> None:
    counts = Counter(name for t in same for name in {entries[i].name for i in range(t.start, t.end)})
    shared = sorted(name for name, n in counts.items() if n > 1)
    if shared:
        raise PipelineError(
            f"{archive}: expected each image of class {wnid} once, found {printable(shared[0])} in "
            f"{counts[shared[0]]} copies of {wnid}.tar ({' | '.join(printable(t.member) for t in same)}; "
            f"{len(shared)} name(s) in more than one copy, which one is meant is unknowable). Rebuild the archive "
            "to keep one copy of the class tar (or rename the images so that every copy is kept), then run "
            "`dvc repro` again"
        )


def index_nested(
    path: str | os.PathLike[str], split: str, source: str, fileobj: IO[bytes] | None = None, size: int | None = None
) -> tuple[list[Entry], list[dict[str, str]]]:
    """Index a tar of per-class `<wnid>.tar` tars (the train archive) without extracting anything (`fileobj`,
    `size`: as for index_tar)."""
    entries: list[Entry] = []
    reported: list[dict[str, str]] = []
    class_tars: list[ClassTar] = []
    size = os.path.getsize(path) if size is None else size
    with open_tar(path, fileobj=fileobj) as outer, _scan_bar(path, size, fileobj) as bar:
        for inner in safe_members(outer, str(path), size):
            bar.update(inner.offset_data - bar.done)  # the class tars before this one are indexed
            if inner.isdir():
                continue
            match = CLASS_TAR.match(PurePosixPath(inner.name).name)
            if not match:
                reported.append(report(split, source, inner.name, "not a per-class <wnid>.tar"))
                continue
            found, notes = _index_inner(
                outer, inner, f"{path} member {printable(inner.name)}", split, source, match.group(1)
            )
            class_tars.append(ClassTar(match.group(1), inner.name, len(entries), len(entries) + len(found)))
            entries += found
            reported += notes
    # an empty class tar, a class in two tars (every case-folding collision of class tars is one: same wnid)
    reported += class_tar_reports(str(path), split, source, class_tars, entries)
    return entries, reported


def _index_inner(
    outer: tarfile.TarFile, inner: tarfile.TarInfo, archive: str, split: str, source: str, wnid: str
) -> tuple[list[Entry], list[dict[str, str]]]:
    fileobj = outer.extractfile(inner)
    try:
        with tarfile.open(fileobj=fileobj, mode="r:", **TAR_ENCODING) as tar:
            return _index_members(
                tar, archive, inner.size, split, source, wnid, prefix=inner.name + "/", base=inner.offset_data
            )
    except tarfile.ReadError as err:
        raise PipelineError(
            f"{archive}: expected an uncompressed tar of class {wnid}, found unreadable data "
            f"({err}); replace the train archive with the official file"
        ) from None


def index_archive(
    path: str | os.PathLike[str], split: str, source: str, fileobj: IO[bytes] | None = None, size: int | None = None
) -> tuple[list[Entry], list[dict[str, str]]]:
    """Index the archive of `split`: the train archive's nested per-class tars (index_nested), else a flat tar."""
    index = index_nested if split == "train" else index_tar
    return index(path, split, source, fileobj, size)
