"""Compaction's output (issue 36 items 1 and 7; tasks/curate/compact_out.py): it writes only into a directory it
owns — never over a folder-mode source, a pipeline output, curation/, versions/ or .git (`make compact OUT=photos`
deleted every source image) — publishes a split set as a whole (a kill never leaves train of one set beside val of
another), and every bad input is one line: an OUT that is a file, a params.yaml that is not UTF-8, a damaged
overlay. `make compact OUT='a b'` passes one argument."""
from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from imagenet_parquet.overlay import write_overlay
from tasks.common import PipelineError
from tasks.curate import compact, compact_out
from tasks.curate import stage as curate
from tests.helpers.params import project, write_params
from tests.helpers.project import REPO
from tests.test_compact import CURATE, WNIDS, _name, _project

FOLDER = {"mode": "folder", "folder": "photos"}
LEGACY = "Written by `python -m tasks.curate.compact` (make compact): the next one replaces this directory\n"


def _tree(path: Path) -> dict[str, bytes]:
    """Every file under `path` (relative name -> bytes); {} when there is no `path`."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _seen(path: Path) -> dict[str, bytes]:
    """What a reader of the compacted set sees: its files but the hidden ones (a marker, a run's temporaries)."""
    return {name: data for name, data in _tree(path).items() if not any(p.startswith(".") for p in name.split("/"))}


def _run(root: Path, out: str, capsys) -> tuple[int, str]:
    """compact's command line on `root`'s params.yaml: (exit code, stderr)."""
    code = compact.main(["--params", str(root / "params.yaml"), "--out", out])
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def folder_project(tmp_path_factory):
    """A compactable project whose params name a folder-mode source inside it, `photos/` (files in it)."""
    root = _project(tmp_path_factory.mktemp("own"))
    for split in ("train", "val"):
        (root / "photos" / split / "cat").mkdir(parents=True)
        (root / "photos" / split / "cat" / "a.jpg").write_bytes(b"\xff\xd8 not ours to delete")
    for name in ("versions/index.json", "data/manifests/train.parquet", ".git/HEAD"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("kept")
    write_params(root, curate=CURATE, extract=FOLDER)
    return root


@pytest.mark.parametrize("out, conflict", [
    ("photos", r"photos \(params.yaml extract.folder, a source\)"),
    ("photos/train", r"photos \(params.yaml extract.folder, a source\)"),
    ("curation", r"curation/exclude.csv \(params.yaml curate.exclude, a source\)"),
    ("data/manifests", r"data/manifests \(params.yaml paths.manifests, a pipeline output\)"),
    ("data/reports", r"data/reports \(params.yaml paths.reports, a pipeline output\)"),  # absent: refused too
    ("versions", r"versions \(params.yaml paths.versions, a pipeline output\)"),
    (".git", r"\.git \(the project's git repository\)"),
    (".dvc/cache", r"\.dvc \(the project's DVC state and cache\)"),
])
def test_compaction_never_writes_over_a_source_or_a_pipeline_output(folder_project, capsys, out, conflict):
    """Item 1: `make compact OUT=photos` replaced photos/train and photos/val (every source image gone)."""
    root = folder_project
    before = {name: _tree(root / name) for name in ("photos", "curation", "versions", "data/manifests", ".git")}
    code, err = _run(root, out, capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert re.search(rf"compact --out: expected a directory apart from \S*{conflict}, found \S+; compaction "
                     r"replaces its output whole: pass another directory, e.g. data/compacted", err), err
    assert {name: _tree(root / name) for name in before} == before
    assert not list(root.glob(f"{Path(out).parent}/.{Path(out).name}.*"))  # no temporary set left either


@pytest.mark.parametrize("entries, message", [
    ({"notes.txt": "mine"}, (r"expected a new or empty directory, or one compaction wrote before \(holding "
                             r"\.compaction\), found \S+/data/mine holding 1 entries \(notes.txt, \.\.\.\) and no "
                             r"\.compaction; compaction replaces its output whole: pass a new directory")),
    ({".compaction": "", "train/x.parquet": "", "notes.txt": "mine"},
     (r"expected only what compaction writes in \S+/data/mine \(\.compaction, compaction.json, train, val\), "
      r"found notes.txt too; move it out")),
])
def test_a_directory_compaction_did_not_write_is_refused_and_kept(tmp_path, entries, message):
    for name, text in entries.items():
        (tmp_path / "data/mine" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "data/mine" / name).write_text(text)
    before = _tree(tmp_path / "data/mine")
    with pytest.raises(PipelineError, match=message):
        compact.job_from_params(project(tmp_path), "data/mine")
    assert _tree(tmp_path / "data/mine") == before


def test_a_new_an_empty_or_a_marked_directory_is_compacted_into(folder_project, capsys):
    root = folder_project
    (root / "data/empty").mkdir()
    for out in ("data/empty", "data/new/deeper", "data/new/deeper"):  # the third: marked by the second
        assert _run(root, out, capsys) == (0, "")
        assert sorted(p.name for p in (root / out).iterdir()) == [".compaction", "compaction.json", "train", "val"]
    assert _tree(root / "data/empty") == _tree(root / "data/new/deeper")
    assert not [p for p in (root / "data/new").iterdir() if p.name != "deeper"]  # no temporary set left


def test_compaction_json_names_the_source_relative_to_the_project(folder_project, capsys):
    """Item 4 for compaction: nothing machine-specific in its output (it recorded the absolute shard path)."""
    assert _run(folder_project, "data/rel", capsys)[0] == 0
    assert '"source": "data/parquet"' in (folder_project / "data/rel/compaction.json").read_text()


def test_an_out_that_is_a_file_is_one_line(folder_project, capsys):
    """Item 7: a raw FileExistsError."""
    (folder_project / "data/a-file").write_text("kept")
    code, err = _run(folder_project, "data/a-file", capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert re.search(r"compact --out: expected a directory \(compaction writes <out>/train, <out>/val\), found "
                     r"\S+/data/a-file, a file; pass a directory path", err), err
    assert (folder_project / "data/a-file").read_text() == "kept"


def test_a_params_yaml_that_is_not_utf8_is_one_line(tmp_path, capsys):
    """Item 7: a raw UnicodeDecodeError (tasks/common/params.py reads it; compact's entry point names it)."""
    (tmp_path / "params.yaml").write_bytes(b"paths:\n  raw: data/r\xe9w\n")
    code, err = _run(tmp_path, "data/compacted", capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "params.yaml" in err and "UTF-8" in err, err


def test_an_overlay_with_a_damaged_shard_name_is_one_line(tmp_path, capsys):
    """Item 7: flipped bytes in the overlay's shard-name dictionary gave a raw UnicodeDecodeError from compact."""
    root = _project(tmp_path)
    path = root / "data/overlay/train.parquet"
    table = pq.read_table(path)
    names = table.column("shard").combine_chunks()
    damaged = pa.array([n.encode().replace(b"-", b"\xff", 1) for n in names.to_pylist()], pa.binary())
    write_overlay(table.set_column(0, "shard", damaged.view(pa.string())), path)  # same metadata, bad names
    write_params(root, curate=CURATE)
    code, err = _run(root, "data/compacted", capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "data/overlay/train.parquet" in err, err
    assert not (root / "data/compacted").exists()


@pytest.mark.parametrize("out", ["data/with space", "data/it's here"])
def test_make_compact_passes_out_as_one_argument(out):
    """Item 7 note: `make compact OUT='data/with space'` ran `--out data/with space` (two arguments)."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    # --no-print-directory: under `make test` (MAKELEVEL 1) make adds "Entering directory" lines
    dry = subprocess.run(["make", "--no-print-directory", "-n", "-o", ".venv/.installed", "compact", f"OUT={out}"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout.strip().splitlines()
    assert len(dry) == 1 and shlex.split(dry[0])[1:] == ["-m", "tasks.curate.compact", "--out", out], dry


KILLER = """
import os, signal, sys
calls, real = [0], os.replace
def replace(*args, **kwargs):  # the run is killed at its n-th rename (every publication is one)
    calls[0] += 1
    if calls[0] == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)
os.replace = os.rename = replace
from tasks.curate import compact
sys.exit(compact.main(["--params", sys.argv[2], "--out", "data/compacted"]))
"""


def test_a_kill_at_any_rename_leaves_the_previous_set_or_the_new_one_never_a_mixed_one(tmp_path, capsys):
    """Item 2: train and val were replaced one after the other; a kill between left new train beside old val."""
    root = _project(tmp_path)
    write_params(root, curate=CURATE)
    assert _run(root, "data/old", capsys)[0] == 0
    old = _tree(root / "data/old")
    with (root / "curation/exclude.csv").open("a") as fh:  # a curation change that changes both splits
        fh.write(f"train,{WNIDS[1]},{_name(17)},dup\nval,{WNIDS[2]},{_name(9, 12)},dup\n")
    curate.write_overlays(curate.job_from_params(project(root, curate=CURATE)))
    assert _run(root, "data/new", capsys)[0] == 0
    new = _tree(root / "data/new")
    assert {k for k in old if old[k] != new.get(k)} >= {"train/train-00001-of-00004.parquet", "compaction.json",
                                                         "val/val-00001-of-00002.parquet"}
    seen, out, sets = [], root / "data/compacted", (_seen(root / "data/old"), _seen(root / "data/new"))
    for n in range(1, 30):
        shutil.rmtree(out, ignore_errors=True)
        _restore(out, old)
        run = subprocess.run([sys.executable, "-c", KILLER, str(n), str(root / "params.yaml")], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        if run.returncode == 0:
            assert _tree(out) == new
            break
        assert run.returncode == -signal.SIGKILL, run.stderr
        state = _seen(out)
        seen.append("old" if state == sets[0] else "new" if state == sets[1] else "none" if not out.exists() else
                    "mixed")
        differ = set(state) ^ set(sets[0]) | {k for k in state if state[k] != sets[0].get(k)}
        assert seen[-1] != "mixed", f"killed at rename {n}: {sorted(differ)} not as in the previous set"
        compact_out.recover(out)  # what the next compaction does first: the previous set back where none is
        assert _tree(out) in (old, new) and not list(out.parent.glob(".compacted.*"))
    else:
        pytest.fail(f"compaction did not finish in 29 renames: {seen}")
    assert "none" in seen and "old" in seen, seen  # the window between the two renames was hit
    compact.compact(compact.job_from_params(project(root, curate=CURATE)))
    assert _tree(out) == new


def _restore(out: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)


# ---------------------------------------------------------------- issue 49: compaction owns only what it wrote
@pytest.fixture()
def compacted_once(tmp_path, capsys):
    """A project compacted into data/compacted (its marker lists what it wrote)."""
    root = _project(tmp_path)
    write_params(root, curate=CURATE)
    assert _run(root, "data/compacted", capsys)[0] == 0
    return root, root / "data/compacted"


def _refused_and_kept(root: Path, out: Path, capsys, pattern: str) -> None:
    before = _tree(out)
    code, err = _run(root, "data/compacted", capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(pattern, err), err
    assert _tree(out) == before and not list(out.parent.glob(".compacted.*"))


def test_the_marker_lists_every_file_compaction_wrote_with_its_size_and_md5(compacted_once):
    _, out = compacted_once
    marker = json.loads((out / ".compaction").read_text())
    files = {name: data for name, data in _tree(out).items() if name != ".compaction"}
    assert marker["format"] == 1 and sorted(marker["files"]) == sorted(files)
    assert all(marker["files"][n] == {"bytes": len(d), "md5": hashlib.md5(d).hexdigest()} for n, d in files.items())


def test_a_file_a_user_put_into_a_split_folder_is_refused_and_kept(compacted_once, capsys):
    """`data/compacted/train/README.md` was removed silently by the next `make compact`."""
    root, out = compacted_once
    (out / "train/README.md").write_text("mine")
    _refused_and_kept(root, out, capsys, r"compact --out: expected only the files compaction wrote in \S+/data/"
                      r"compacted \(listed in its \.compaction\), unchanged, found train/README\.md: not listed in "
                      r"\.compaction: not written by compaction; move it out of the directory")


@pytest.mark.parametrize("change, found", [
    (lambda out: (out / "val/notes").mkdir(), r"val/notes: not listed"),
    (lambda out: (out / "train/link.parquet").symlink_to(out / "compaction.json"), r"train/link\.parquet: not listed"),
    (lambda out: _flip(next(iter(sorted((out / "train").glob("*.parquet"))))),
     r"train/train-00001-of-00004\.parquet: changed since compaction wrote it \(md5 [0-9a-f]{32}, listed [0-9a-f]{32}\)"),
    (lambda out: (out / "compaction.json").write_text("{}"), r"compaction\.json: changed since compaction wrote it "
     r"\(2 bytes, listed"),
])
def test_anything_compaction_did_not_write_or_that_changed_is_refused(compacted_once, capsys, change, found):
    root, out = compacted_once
    change(out)
    _refused_and_kept(root, out, capsys, f"found {found}")


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF  # same size: only the md5 tells
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("marker, found", [
    ("", r"found no JSON \(Expecting value at line 1 column 1\)"),
    (LEGACY, r"found the marker of an earlier compaction, which lists no files"),
    ('{"format": 1, "note": "", "files": {"../../params.yaml": {"bytes": 1, "md5": "' + "0" * 32 + '"}}}',
     r"found files: the key '\.\./\.\./params\.yaml': expected compaction\.json or <split>/<shard>\.parquet \(a "
     r"split of train, val; no hidden name, no path\), found '\.\./\.\./params\.yaml'"),
    ('{"format": 1, "note": "", "files": {}, "files": {}}', r"found ValueError: the key 'files' twice"),
    ('{"format": 2, "note": "", "files": {}}', r"found format: expected one of 1, found 2"),
])
def test_an_empty_or_malformed_marker_is_refused(compacted_once, capsys, marker, found):
    """An empty `.compaction` was accepted as compaction's."""
    root, out = compacted_once
    (out / ".compaction").write_text(marker)
    _refused_and_kept(root, out, capsys, r"\S+/data/compacted/\.compaction: expected the marker compaction writes "
                      rf"\(JSON, format 1: the files it wrote, each with its bytes and md5\), {found}.*; move out "
                      r"what is yours, remove \S+/data/compacted and compact again, or pass a new directory")


def test_a_file_put_there_while_compaction_ran_is_refused_before_the_previous_set_goes(compacted_once, capsys,
                                                                                       monkeypatch):
    root, out = compacted_once
    before, write_split = _tree(out), compact.write_split

    def and_a_user(written, plan):
        (out / "val/mine.txt").write_text("mine")  # between the first check and the publish
        return write_split(written, plan)

    monkeypatch.setattr(compact, "write_split", and_a_user)
    code, err = _run(root, "data/compacted", capsys)
    assert code == 1 and "found val/mine.txt: put there or changed while compaction ran" in err, err
    assert _tree(out) == {**before, "val/mine.txt": b"mine"} and not list(out.parent.glob(".compacted.*"))


def test_in_a_dvc_project_the_next_compaction_reads_none_of_the_previous_set(tmp_path, capsys, monkeypatch):
    """DVC's state learns each published file's MD5 (size, mtime, inode): the ownership check hashes nothing."""
    root = _project(tmp_path)
    write_params(root, curate=CURATE)
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=root, check=True, timeout=60)
    assert _run(root, "data/compacted", capsys)[0] == 0
    monkeypatch.setattr(compact_out, "_md5", lambda path: pytest.fail(f"{path} read again"))
    assert _run(root, "data/compacted", capsys)[0] == 0
    _flip(root / "data/compacted/compaction.json")  # a change: DVC's record misses, the file is hashed (and refused)
    monkeypatch.undo()
    assert "compaction.json: changed since compaction wrote it" in _run(root, "data/compacted", capsys)[1]
