"""The layout history is an input (issue 49; tasks/convert/history_schema.py, tasks/convert/listed.py): checked
whole before convert works, every listed shard held to its footer and md5, and any problem one line naming
versions/layout.json, the generation and the field, expected and found, and what to do — never a traceback, never
a wrong count written into data/metrics/convert.json or the history. Each case the issue found passed or ended in a
traceback before."""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import typing
from pathlib import Path

import pytest

from tasks.common import SPLITS, PipelineError
from tasks.common.dvc_state import stat_key, state_put
from tasks.convert import listed
from tasks.convert.history_schema import Split
from tasks.convert.plan import order_rows, plan_split, shard_name_ok
from tests.helpers.datasets import make_job
from tests.helpers.histories import LAYOUT, PARAMS, assert_true_run, build, convert, linked_copy

NAME = r"'train-g1-h[0-9a-f]{16}\.parquet'"
TODO = r"`make relayout`.*or restore the file from git"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(tmp_path_factory.mktemp("history"))


def _case(built, tmp_path, edit) -> Path:
    """A linked copy of v1 whose history `edit(doc, root)` changed (in place: it may move shard files too)."""
    root = linked_copy(built["v1"], tmp_path / "case")
    doc = json.loads((root / LAYOUT).read_text())
    edit(doc, root)
    (root / LAYOUT).unlink()  # a link of v1's: written anew, never through
    (root / LAYOUT).write_text(json.dumps(doc, indent=1))
    return root


def _refused(root: Path, pattern: str) -> str:
    """convert refuses in one line matching `pattern` (after the history's path), writing nothing it counts."""
    before = {p: (root / p).read_bytes() for p in (LAYOUT, "data/metrics/convert.json")}
    with pytest.raises(PipelineError) as err:
        convert(root)
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(root / LAYOUT) + ": "), message
    assert re.search(pattern, message), message
    assert {p: (root / p).read_bytes() for p in before} == before  # no count written: metric, history
    return message


def _gen1(doc) -> dict:
    return doc["splits"]["train"][1]["shards"][0]


def test_a_row_count_edit_is_refused_before_it_reaches_the_metric(built, tmp_path):
    """15 -> 14: passed, was written back into layout.json, and convert.json reported one row fewer."""
    def edit(doc, root):
        _gen1(doc)["rows"] -= 1

    rows = _gen1(json.loads((built["v1"] / LAYOUT).read_text()))["rows"]
    _refused(_case(built, tmp_path, edit), rf"train generation 1, shard 0 \({NAME}\), rows: expected {rows} \(what "
             rf"the footer of \S+ holds\), found {rows - 1}; if the history is right, `dvc checkout`.*; else {TODO}")


def test_a_hidden_shard_name_is_refused(built, tmp_path):
    """`..parquet` passed: a hidden file pyarrow and pandas skip when reading the directory (rows silently lost)."""
    def edit(doc, root):
        shard = _gen1(doc)
        (root / "data/parquet/train" / shard["name"]).rename(root / "data/parquet/train/..parquet")
        shard["name"] = "..parquet"

    _refused(_case(built, tmp_path, edit), r"train generation 1, shard 0 \('\.\.parquet'\), name: expected a name "
             rf"train-g1-<stem>\.parquet \(stem h<16 hex>.*\), found '\.\.parquet'; run {TODO}")


def test_another_splits_shard_listed_under_train_is_refused(built, tmp_path):
    """A `val-…` name linked a val shard into train/ (found only later by validate, not naming layout.json)."""
    def edit(doc, root):
        shard = doc["splits"]["val"][1]["shards"][0]
        shutil.copy(root / "data/parquet/val" / shard["name"], root / "data/parquet/train" / shard["name"])
        doc["splits"]["train"][1]["shards"].append(shard)

    _refused(_case(built, tmp_path, edit), r"train generation 1, shard 1 \('val-g1-h[0-9a-f]{16}\.parquet'\), name: "
             r"expected a name train-g1-<stem>\.parquet")


@pytest.mark.parametrize("edit, pattern", [
    # file_bytes as text: `ValueError: Cannot specify ',' with 's'` from the error message's own formatting
    (lambda d: _gen1(d).update(file_bytes="12"),
     rf"train generation 1, shard 0 \({NAME}\), file_bytes: expected an integer in \[1, 9223372036854775807\], "
     r"found '12'"),
    # a bad entry without record.name: `KeyError: 'name'`
    (lambda d: d["splits"]["train"][0]["bad"][0]["record"].pop("name"),
     r"train generation 0, bad 0, record\.name: missing; expected the image's manifest name"),
    # a bad entry that is not an object: `TypeError`
    (lambda d: d["splits"]["train"][0]["bad"].__setitem__(0, "zero.JPEG"),
     r"train generation 0, bad 0: expected a mapping, found 'zero.JPEG'"),
    (lambda d: _gen1(d).update(rows=True), rf"{NAME}\), rows: expected an integer in \[0, \d+\], found True"),
    (lambda d: _gen1(d).update(rows=10**30), r"rows: expected an integer in \[0, 9223372036854775807\], found 1000"),
    (lambda d: _gen1(d).update(rows=-1), r"rows: expected an integer in \[0, \d+\], found -1"),
    (lambda d: _gen1(d).update(md5="../../../../params"), r"md5: expected 32 lowercase hex digits"),
    (lambda d: _gen1(d).update(extra=1), r"train generation 1, shard 0 \(\S+\), extra: unknown key"),
    (lambda d: _gen1(d).update(name="/etc/passwd"), r"name: expected a name train-g1-<stem>\.parquet"),
    (lambda d: _gen1(d).update(name="train-g1-../../x.parquet"), r"name: expected a name train-g1-<stem>"),
    (lambda d: _gen1(d).update(name="train-g2-h0123456789abcdef.parquet"), r"generation 1.*name: expected a name "
     r"train-g1-<stem>"),
    (lambda d: d["splits"]["train"].reverse(), r"train generation 0, generation: expected 0 \(0, 1, \.\.\. in order\), "
     r"found 1"),
    (lambda d: d["splits"]["train"].append(d["splits"]["train"][1]), r"train generation 2, generation: expected 2"),
    (lambda d: d["splits"]["train"][1]["shards"].append(_gen1(d)), r"train generation 1, shard \d \(\S+\), name: "
     r"expected a name no other shard has \(generation 1 lists it too\)"),
    (lambda d: d["splits"]["train"][1]["bad"].append(d["splits"]["train"][0]["bad"][0]),
     r"train generation 1, bad 0 \('zero.JPEG'\), record.name: expected an image no other bad entry names"),
    (lambda d: d["splits"]["train"][0]["bad"][0]["record"].update(split="val"), r"record.split: expected 'train'"),
    (lambda d: d["splits"].update(test=d["splits"]["train"]), r"splits: the key 'test': expected one of train, val"),
    (lambda d: d["splits"].update(train=[]), r"splits\.train: expected a list of the split's generations \(at least "
     r"one\).*, found \[\]"),
    (lambda d: d.update(format=2), r"format: expected one of 1, found 2"),
    (lambda d: d.update(identity=7), r"identity: expected 64 lowercase hex digits"),
    (lambda d: d.pop("splits"), r"splits: missing; expected a mapping of split"),
])
def test_a_malformed_history_is_one_line_naming_the_generation_and_the_field(built, tmp_path, edit, pattern):
    _refused(_case(built, tmp_path, lambda doc, root: edit(doc)), pattern)


@pytest.mark.parametrize("text, found", [
    ('{"format": 1, "format": 1}', r"found ValueError: the key 'format' twice in one object"),
    ('{"format": NaN}', r"found ValueError: NaN, which is no JSON number"),
    ('{"format": 1' + "9" * 5000 + "}", r"found ValueError: Exceeds the limit"),
    ('{"format": 1', r"found no JSON \(Expecting ',' delimiter at line 1 column \d+\)"),
    (b'{"format": "\xff"}', r"found bytes that are not UTF-8 text"),
])
def test_a_history_that_is_no_json_document_is_one_line(built, tmp_path, text, found):
    root = linked_copy(built["v1"], tmp_path / "case")
    (root / LAYOUT).unlink()
    (root / LAYOUT).write_bytes(text if isinstance(text, bytes) else text.encode())
    _refused(root, r"expected the layout history convert writes \(JSON, format 1.*\), " + found + r".*make relayout")


@pytest.mark.parametrize("field, change", [("image_bytes", 1), ("input_bytes", 1), ("input_bytes", -1)])
def test_a_size_the_footer_contradicts_is_refused(built, tmp_path, field, change):
    """image_bytes against the footer byte index; input_bytes of a shard of rows stored as found, in a generation
    that quarantined nothing (exactly its image bytes)."""
    def edit(doc, root):
        _gen1(doc)[field] += change

    _refused(_case(built, tmp_path, edit), rf"train generation 1, shard 0 \({NAME}\), {field}: expected \d+ \(what "
             r"the footer of \S+ holds\), found \d+")


@pytest.mark.parametrize("generation, how", [(0, "the file's MD5"),
                                              (1, "the MD5 convert recorded when it wrote this file")])
def test_a_wrong_md5_is_refused_naming_the_files_md5(built, tmp_path, generation, how):
    """Generation 0's shards are hashed (no stats of theirs are left, no DVC here); generation 1's are known from
    the stats the last run wrote for these very files (size, mtime, inode)."""
    def edit(doc, root):
        doc["splits"]["train"][generation]["shards"][0]["md5"] = "0" * 32

    shard = json.loads((built["v1"] / LAYOUT).read_text())["splits"]["train"][generation]["shards"][0]
    _refused(_case(built, tmp_path, edit), rf"train generation {generation}, shard 0 \('{shard['name']}'\), md5: "
             rf"expected '{shard['md5']}' \({how}\), found '0{{32}}'")


def test_a_shard_listed_in_the_wrong_generation_is_refused_by_its_footer(built, tmp_path):
    """A generation-1 shard renamed and listed as generation 0 (names by the contract): its footer says 1."""
    def edit(doc, root):
        shard = doc["splits"]["train"][1]["shards"].pop(0)
        new = shard["name"].replace("-g1-", "-")
        (root / "data/parquet/train" / shard["name"]).rename(root / "data/parquet/train" / new)
        doc["splits"]["train"][0]["shards"].append({**shard, "name": new})

    _refused(_case(built, tmp_path, edit), r"train generation 0, shard \d+ \('train-h[0-9a-f]{16}\.parquet'\), "
             r"generation: expected 1 \(what the footer of \S+ holds\), found 0")


def test_a_history_of_an_earlier_version_appends_again_to_the_same_shards(built, tmp_path):
    """v0's history over v1's shards (a checkout of an older layout.json): generation 1 is planned again, to the
    same names and bytes; v1's history over v0's shards names the missing shard (`dvc pull`)."""
    root = linked_copy(built["v1"], tmp_path / "old")
    (root / LAYOUT).unlink()
    shutil.copy(built["v0"] / LAYOUT, root / LAYOUT)
    assert_true_run(root, built["fresh"], convert(root))
    assert (root / LAYOUT).read_bytes() == (built["v1"] / LAYOUT).read_bytes()
    newer = linked_copy(built["v0"], tmp_path / "new")
    shutil.copy(built["v1"] / "data/manifests/train.parquet", newer / "data/manifests/train.parquet")
    (newer / LAYOUT).unlink()
    shutil.copy(built["v1"] / LAYOUT, newer / LAYOUT)
    with pytest.raises(PipelineError, match=rf"expected the shard of generation 1 that \S+/{LAYOUT} lists .*dvc pull"):
        convert(newer)


def test_listed_md5s_are_known_without_reading_a_shard_where_a_source_vouches(built, tmp_path, monkeypatch):
    """Linked back (`vouched`), convert's own stats of this very file, DVC's state: no read; else it is hashed."""
    root = linked_copy(built["v1"], tmp_path / "md5")
    job = make_job(root, **PARAMS)
    generations = json.loads((root / LAYOUT).read_text())["splits"]["train"]
    files = [root / "data/parquet/train" / s["name"] for g in generations for s in g["shards"]]
    reads = []
    monkeypatch.setattr(listed, "_md5", lambda path: reads.append(path) or hashlib.md5(path.read_bytes()).hexdigest())
    listed.check_md5s(job, "train", generations, set(files))
    assert reads == []
    listed.check_md5s(job, "train", generations, set())
    own = {p for p in files if "-g1-" in p.name}  # the last run's stats name them (size, mtime, inode)
    assert set(reads) == set(files) - own and own
    monkeypatch.setattr(listed, "state_md5s", lambda paths: {str(p): hashlib.md5(p.read_bytes()).hexdigest()
                                                              for p in paths})
    reads.clear()
    listed.check_md5s(job, "train", generations, set())
    assert reads == []


def test_dvc_state_vouches_for_a_listed_shard(built, tmp_path):
    """The state DVC keeps (tasks/common/dvc_state.py): an entry for the file as it is now is its md5."""
    import subprocess

    root = linked_copy(built["v1"], tmp_path / "dvc")
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=root, check=True, timeout=60)
    generations = json.loads((root / LAYOUT).read_text())["splits"]["train"]
    shard = generations[0]["shards"][0]
    path = root / "data/parquet/train" / shard["name"]
    assert state_put([(path, "f" * 32, stat_key(path))]) == 1  # DVC's record says other bytes
    with pytest.raises(PipelineError, match=rf"md5: expected '{'f' * 32}' \(DVC's record of this file\)"):
        listed.check_md5s(make_job(root, **PARAMS), "train", generations, set())


def test_the_models_splits_are_the_pipelines():
    assert set(typing.get_args(Split)) == set(SPLITS)


def test_every_name_the_planner_gives_is_one_the_contract_accepts():
    import pyarrow as pa

    names = ["a.JPEG", "0001.jpg", "with space.jpg", "..", ".hidden", "x.parquet", "a-b", "~", "ü.jpg", "a" * 200]
    rows = pa.table({"label": list(range(len(names))), "wnid": [f"n{i}" if i % 2 else names[i] for i in
                                                                  range(len(names))],
                     "name": names, "source": ["s"] * len(names), "member": names,
                     "offset": list(range(len(names))), "size": [1 << 20] * len(names)})
    for order in ("hashed", "class"):
        plans = plan_split("train", order_rows(rows, order), 1 << 20, "key", order=order)
        assert len(plans) > 3
        for generation in (0, 3):
            for plan in plans:
                name = f"train-g{generation}-{plan.stem}.parquet" if generation else plan.name
                assert shard_name_ok(name, "train", generation), name
                assert not shard_name_ok(name, "val", generation) and not shard_name_ok(name, "train", 1)
    assert shard_name_ok("train-empty.parquet", "train", 0)
