"""Hardening of the pipeline (issue 21, items 8-13): signed URLs refused in params, bounded params and paths inside
the project, a padded decompression bomb quarantined and refused by the reader, a full disk named in one line,
changes.json counted from the curation key sets, curation errors naming the curation line."""
from __future__ import annotations

import pytest

from tasks.acquire.obtain import fetch_archive
from tasks.acquire.remote import FetchOptions
from tasks.common import ARCHIVES, PipelineError
from tasks.common.params import validate_params
from tests.helpers.params import _overridden
from tests.helpers.servers import RangeServer

VAL = ARCHIVES["val"]
SIGNED = [
    "https://bucket.s3.amazonaws.com/ilsvrc/x.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE%2F"
    "20260101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20260101T000000Z&X-Amz-Signature=deadbeefcafe0123",
    "https://d111.cloudfront.net/x.tar?Expires=1767225600&Signature=deadbeefcafe0123&Key-Pair-Id=APKAEXAMPLE",
    "https://acct.blob.core.windows.net/c/x.tar?sv=2022-11-02&se=2026-01-01&sp=r&sig=deadbeefcafe0123",
    "https://mirror.example.org/x.tar?token=deadbeefcafe0123",
]


# ---------------------------------------------------------------- item 8: signed URLs
@pytest.mark.parametrize("url", SIGNED)
@pytest.mark.parametrize("key", ["source", "train", "val", "devkit"])
def test_a_signed_url_in_params_is_refused_with_its_values_redacted(key, url):
    with pytest.raises(PipelineError) as err:
        validate_params(_overridden({"download": {key: url}}))
    message = str(err.value)
    assert f"download.{key}: expected a URL without user info (user:password@) or a signed / token query" in message
    assert "found a signed query ?" in message and "=***" in message and "(values not shown)" in message
    assert "~/.netrc" in message and "environment" in message and "fsspec config" in message
    assert "deadbeefcafe0123" not in message and "AKIAEXAMPLE" not in message and "APKAEXAMPLE" not in message
    for fine in ("https://mirror.example.org/x.tar?download=1", "https://mirror.example.org/x.tar"):
        validate_params(_overridden({"download": {key: fine}}))


def test_a_404_advises_netrc_never_a_password_in_the_url(tmp_path):
    (tmp_path / "srv").mkdir()
    with RangeServer(tmp_path / "srv") as server, pytest.raises(PipelineError) as err:
        opts = FetchOptions(retries=0, backoff_s=0.01, timeout_s=2.0, chunk_bytes=64 << 10, progress=False)
        fetch_archive(VAL, f"{server.url}/missing.tar", tmp_path / "raw", opts, tmp_path / "md5_cache.json")
    message = str(err.value)
    assert "found HTTP 404" in message and "~/.netrc" in message
    assert "user:password in the URL" not in message and "refuses them in the URL" in message


# ---------------------------------------------------------------- item 12: params with bounds
def _problems(**sections) -> str:
    with pytest.raises(PipelineError) as err:
        validate_params(_overridden(sections))
    return str(err.value)


def test_sample_sizes_have_an_upper_bound():
    message = _problems(sample={"train_per_class": 100_000_000, "val_per_class": 10_000})
    assert "sample.train_per_class: expected an integer in [1, 1300], found 100000000" in message
    assert "sample.val_per_class: expected an integer in [1, 50], found 10000" in message


@pytest.mark.parametrize("value, found", [
    ("", "found ''"),
    ("../elsewhere/parquet", "found '../elsewhere/parquet' (outside the project)"),
    ("data/../..", "found 'data/../..' (outside the project)"),
    (".", "found '.' (the project itself)"),
])
def test_a_paths_entry_empty_or_outside_the_project_is_refused_at_params_check(value, found):
    message = _problems(paths={"parquet": value})
    assert "paths.parquet: expected " in message and found in message
    assert "1 problem(s)" in message


def test_an_absolute_path_outside_the_project_is_refused_where_the_root_is_known(tmp_path):
    from tasks.common.params import load_project
    from tests.helpers.params import write_params

    root = tmp_path / "project"
    params = write_params(root, paths={"reports": str(tmp_path / "elsewhere")})  # no root given: not judged
    with pytest.raises(PipelineError) as err:
        load_project(params)
    message = str(err.value)
    assert f"paths.reports: expected a path inside the project ({root})" in message
    assert f"found '{tmp_path / 'elsewhere'}' (outside the project)" in message
    write_params(root, paths={"reports": str(root / "data/reports")})
    assert load_project(params).path("reports") == root / "data/reports"  # absolute but inside: fine


def test_a_checksums_table_that_is_a_device_or_too_large_is_refused_before_reading_it(tmp_path):
    import subprocess
    import sys

    from tests.helpers.project import REPO

    (tmp_path / "big.tsv").write_bytes(b"name\tmd5\n" + b"x" * (2 << 20))
    probe = (
        "import resource, sys; from pathlib import Path\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "from tasks.acquire.verify import read_md5_table\n"
        "for path in sys.argv[1:]:\n"
        "    try: read_md5_table(Path(path))\n"
        "    except Exception as err: print(type(err).__name__, err)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, "/dev/zero", str(tmp_path / "big.tsv")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # a 2 GiB cap: the old read_text died
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout + done.stderr
    assert lines[0].startswith("PipelineError /dev/zero: expected an MD5 table") and "a device" in lines[0]
    assert "verify.checksums" in lines[0]
    assert "big.tsv: expected an MD5 table" in lines[1] and "larger than 1,048,576 bytes" in lines[1]


# ---------------------------------------------------------------- items 11 (relabel outside the subset), 13
CA, CB, CC = "n01440764", "n01443537", "n01484850"
EXCLUDE, RELABEL = "split,wnid,name,reason\n", "split,wnid,name,new_wnid,reason\n"


def _curation(root, exclude="", relabel="", bom=""):
    from tests.test_curate import read_lines

    return read_lines(root, exclude, relabel, bom)


def _folder_run(root, curation, **options):
    """extract (folder mode, `options`), then the curate stage with `curation` over the converted output."""
    from tests.test_curate import curate_out
    from tests.test_extract import make_tree, run_folder

    tree = root / "tree"
    make_tree(tree, {"train": {CA: ["a1.JPEG", "a2.JPEG", "a3.JPEG"], CB: ["b1.JPEG"], CC: ["c1.JPEG"]},
                     "val": {CA: ["va.JPEG"], CB: ["vb.JPEG"], CC: ["vc.JPEG"]}})
    report = run_folder(tree, root / "out", **options)
    return report, curate_out(root / "out", curation)


def test_a_curation_csv_with_a_utf8_bom_is_read(tmp_path):
    from tests.test_curate import overlaid

    curation = _curation(tmp_path, f"train,{CA},a2.JPEG,dup\n", f"train,{CA},a1.JPEG,{CC},wrong\n", bom="\ufeff")
    assert [line.name for line in curation.exclude] == ["a2.JPEG"] and curation.relabel[0].new_wnid == CC
    report, curated = _folder_run(tmp_path, curation)
    assert report["images"]["train"] == 5 and curated["relabel"]["train"]["by_class"] == {f"{CA}->{CC}": 1}
    kept = overlaid(tmp_path / "out/parquet", tmp_path / "out/label_map.json", "train")
    assert len(kept) == 4 and (CC, "a1.JPEG") in kept


@pytest.mark.parametrize("exclude, relabel, line, found", [
    (f"val,{CC},vc.JPEG,blurry\n", "", "exclude.csv:2", f"expected class {CC} left with images in val"),
    ("", f"val,{CC},vc.JPEG,{CA},wrong\n", "relabel.csv:2", f"expected class {CC} left with images in val"),
    ("", f"val,{CA},va.JPEG,n01494475,wrong\n", "relabel.csv:2",
     "expected new_wnid a class of the dataset (label_map.json: the classes extract keeps; a relabel never drops), "
     "found 'n01494475'"),
])
def test_a_curation_line_that_unbalances_the_classes_is_named_not_the_source(tmp_path, exclude, relabel, line, found):
    with pytest.raises(PipelineError) as err:
        _folder_run(tmp_path, _curation(tmp_path, exclude, relabel))
    message = str(err.value)
    assert message.startswith(f"{tmp_path}/{line}: ") and found in message, message
    assert "tree/" not in message and not (tmp_path / "out/overlay").exists()


def test_a_relabel_into_a_class_outside_extract_classes_is_refused(tmp_path):
    (tmp_path / "classes.txt").write_text(f"{CA}\n{CB}\n")
    curation = _curation(tmp_path, "", f"train,{CA},a2.JPEG,{CC},wrong\n")
    with pytest.raises(PipelineError) as err:  # before: dropped silently, reported as relabelled
        _folder_run(tmp_path, curation, classes=str(tmp_path / "classes.txt"))
    message = str(err.value)
    assert message.startswith(f"{tmp_path}/relabel.csv:2: expected new_wnid a class of the dataset")
    assert f"found '{CC}'" in message and not (tmp_path / "out/overlay").exists()


def test_a_relabel_into_a_class_not_in_the_devkit_names_the_curation_line(tmp_path):
    from tests.helpers.archives import run_extract, small_release

    from tests.test_curate import curate_out

    small_release(tmp_path / "raw")  # a devkit of 4 classes
    curation = _curation(tmp_path, "", "train,n01440764,n01440764_1.JPEG,n01494475,wrong\n")
    run_extract(tmp_path / "raw", tmp_path / "out")
    with pytest.raises(PipelineError) as err:  # the label map holds the devkit's classes: n01494475 is none
        curate_out(tmp_path / "out", curation)
    message = str(err.value)
    assert message.startswith(f"{tmp_path}/relabel.csv:2: expected new_wnid a class of the dataset")
    assert "found 'n01494475'" in message and not (tmp_path / "out/overlay").exists()


# ---------------------------------------------------------------- item 11: changes.json from the key sets
def _version(counts: dict[str, int], curated: list[list]) -> dict:
    classes = {w: {"count": n, "digest": f"{w}-{n}-{len(curated)}"} for w, n in counts.items()}
    return {"label_map": "same", "classes": {"train": classes, "val": {}}, "shards": {"train": {}, "val": {}},
            "curated": curated}


def _changes(tmp_path, before: dict, after: dict) -> tuple[dict, dict]:
    import json

    from tasks.validate import changes

    changes.record_version(tmp_path, before)
    found = changes.record_version(tmp_path, after)
    rows = {row["wnid"]: row for row in found["train"]["classes"]}
    return rows, json.loads((tmp_path / "changes.json").read_text())["train"]


def test_undoing_an_exclusion_counts_an_image_added_never_a_negative_removal(tmp_path):
    excluded = [["exclude", "train", CA, "a3.JPEG", None]]
    rows, metrics = _changes(tmp_path, _version({CA: 2}, excluded), _version({CA: 3}, []))
    assert rows[CA] == {"wnid": CA, "before": 2, "after": 3, "added": 1, "removed": 0, "relabelled_in": 0,
                        "relabelled_out": 0}
    assert (metrics["images_added"], metrics["images_removed"], metrics["images_relabelled"]) == (1, 0, 0)
    from tasks.validate.report import _changes_section

    table = "\n".join(_changes_section({"changes": {"previous": True, "label_map_changed": False,
                                                    "train": {"classes": list(rows.values()), "shards_rewritten": [],
                                                              "shards_removed": [], "shards": 0},
                                                    "val": {"classes": [], "shards_rewritten": [],
                                                            "shards_removed": [], "shards": 0}}}))
    assert f"| {CA} | 2 | 3 | 1 | 0 | 0 | 0 |" in table and "-1" not in table


def test_undoing_or_retargeting_a_relabel_moves_the_image_between_the_right_classes(tmp_path):
    to_b = [["relabel", "train", CA, "a1.JPEG", CB]]
    rows, metrics = _changes(tmp_path / "undo", _version({CA: 2, CB: 2}, to_b), _version({CA: 3, CB: 1}, []))
    assert (rows[CA]["relabelled_in"], rows[CB]["relabelled_out"], metrics["images_relabelled"]) == (1, 1, 1)
    assert metrics["images_added"] == metrics["images_removed"] == 0
    to_c = [["relabel", "train", CA, "a1.JPEG", CC]]
    rows, metrics = _changes(tmp_path / "retarget", _version({CA: 2, CB: 2, CC: 1}, to_b),
                             _version({CA: 2, CB: 1, CC: 2}, to_c))
    assert set(rows) == {CB, CC} and rows[CB]["relabelled_out"] == 1 and rows[CC]["relabelled_in"] == 1
    assert (metrics["images_relabelled"], metrics["images_added"], metrics["images_removed"]) == (1, 0, 0)
    rows, metrics = _changes(tmp_path / "swap", _version({CA: 2, CB: 2}, to_b),
                             _version({CA: 2, CB: 1}, [["exclude", "train", CA, "a1.JPEG", None]]))
    assert rows[CB]["removed"] == 1 and (metrics["images_removed"], metrics["images_added"]) == (1, 0)
    assert all(v >= 0 for row in rows.values() for v in row.values() if isinstance(v, int))


# ---------------------------------------------------------------- item 9: a padded decompression bomb
def _padded_bomb(marker: bytes = b"\xff\xfe") -> bytes:
    """A real 16x16 JPEG whose frame claims 12000x12000, plus ~281 KB of COM (or APPn) segments after SOI: as many
    bytes as the 2,250,000 declared 8x8 blocks need at 1 bit each, so the file size looks plausible."""
    import struct

    from tests.helpers.images import jpeg

    from tasks.convert.jpeg_header import read_header

    data = bytearray(jpeg(size=(16, 16)))
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, 12000, 12000)
    if marker == b"\xff\xd0":  # restart markers inside the scan data
        scan = read_header(bytes(data)).scan
        return bytes(data[:scan] + marker * 150_000 + data[scan:])
    segment = marker + struct.pack(">H", 65535) + b"\x00" * 65533
    return bytes(data[:2] + segment * 5 + data[2:])


@pytest.mark.parametrize("marker", [b"\xff\xfe", b"\xff\xe2", b"\xff\xd0"])
def test_a_padded_bomb_is_a_bad_image_whatever_the_policy(tmp_path, marker):
    import json

    from tasks.convert import imaging
    from tasks.convert.distribute import run_local
    from tests.helpers.datasets import flat_dataset, make_job
    from tests.helpers.images import jpeg

    bomb = _padded_bomb(marker)
    assert len(bomb) * 8 > 2_250_000  # the file size alone passes the 1-bit-per-block bound
    for policy in (imaging.Policy(), imaging.Policy(policy="reencode"), imaging.Policy(full_decode=True)):
        with pytest.raises(imaging.BadImage, match=r"^implausible_size: 12000x12000 declared .* found \d+ bytes of "
                                                   rf"image data in a {len(bomb)}-byte file"):
            imaging.encode_image(bomb, policy)
    flat_dataset(tmp_path, [("n01440764", "n01440764_0.JPEG", bomb), ("n01440764", "n01440764_1.JPEG", jpeg())])
    job = make_job(tmp_path, max_bad_fraction=0.5)
    assert run_local(job, progress=False)["bad_images"] == 1
    [record] = [json.loads(line) for line in (job.parquet / "bad_images.jsonl").read_text().splitlines()]
    assert record["name"] == "n01440764_0.JPEG" and record["reason"].startswith("implausible_size: 12000x12000")


def test_the_reader_refuses_to_decode_more_pixels_than_its_bound():
    import warnings

    from PIL import Image

    from imagenet_parquet import decode_image
    from tests.helpers.images import jpeg

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with pytest.raises(Image.DecompressionBombError, match=r"12000x12000 = 144,000,000 pixels to decode, more "
                                                               r"than max_pixels=89,478,485"):
            decode_image(_padded_bomb())  # never the 432 MB allocation
        with pytest.raises(Image.DecompressionBombError, match=r"max_pixels=1,000"):
            decode_image(jpeg(size=(64, 64)), max_pixels=1000)
    assert decode_image(jpeg(size=(64, 64)), max_pixels=64 * 64).size == (64, 64)


def test_real_progressive_and_restart_marker_jpegs_stay_plausible():
    import io

    from PIL import Image

    from tasks.convert import imaging
    from tasks.convert.jpeg_header import entropy_coded_bytes, read_header

    flat = Image.new("RGB", (2048, 2048), (90, 90, 90))  # as few bits per block as an image has
    for options in ({"progressive": True}, {"restart_marker_blocks": 1}, {}):
        out = io.BytesIO()
        flat.save(out, "JPEG", quality=50, **options)
        data = out.getvalue()
        head = read_header(data)
        assert head is not None and 0 < entropy_coded_bytes(data, head.scan) <= len(data) - head.scan
        assert imaging.encode_image(data, imaging.Policy()).transform == "none"


# ---------------------------------------------------------------- item 10: a full disk, one line naming the directory
def _fill(mount):
    """Write into `mount` until the filesystem refuses (ENOSPC): every later write there fails for real."""
    import errno
    import os

    fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as err:
        assert err.errno == errno.ENOSPC
    finally:
        os.close(fd)


@pytest.fixture
def full_disk(tmp_path):
    """A real full filesystem: a 1 MiB tmpfs at tmp_path/full, filled (needs root; skipped where mount is refused —
    test_a_write_error_in_the_reports_names_the_directory injects the error instead)."""
    import subprocess

    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        _fill(mount)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def _one_clear_line(err, directory, name, key):
    message = str(err.value)
    assert message.startswith(f"{directory}: expected to write {name} here, found No space left on device "
                              "(errno 28); free some space there"), message
    assert f"({key} in params.yaml names it), then run again" in message and "\n" not in message


def test_a_full_reports_or_versions_disk_is_one_line_naming_the_directory(tmp_path, full_disk):
    from tasks.validate import changes, contact_sheet, near_dup

    from tests.helpers.datasets import make_dataset

    ds = make_dataset(tmp_path / "project").write()
    reports, versions = full_disk / "reports", full_disk / "versions"
    with pytest.raises(PipelineError) as err:
        contact_sheet.write_contact_sheet(ds.parquet_dir, ds.label_map_path, reports / "contact_sheet.png", 2, 20)
    _one_clear_line(err, reports, "contact_sheet.png", "paths.reports")
    with pytest.raises(PipelineError) as err:
        near_dup.write_near_duplicate_outputs({}, ds.parquet_dir, reports)
    _one_clear_line(err, reports, "near_duplicates.png", "paths.reports")
    with pytest.raises(PipelineError) as err:
        changes.record_version(versions, {"label_map": "x", "classes": {}, "shards": {}, "curated": []})
    _one_clear_line(err, versions, "index.json", "paths.versions")
    assert sorted(p.name for p in full_disk.rglob("*")) == ["filler", "reports", "versions"]  # nothing half-written


def test_a_full_scratch_disk_is_one_line_naming_the_directory(tmp_path):
    import subprocess

    from tasks.convert.distribute import run_local
    from tests.helpers.datasets import flat_dataset, make_job
    from tests.helpers.images import jpeg

    root = tmp_path / "project"
    flat_dataset(root, [("n01440764", f"n01440764_{i}.JPEG", jpeg(size=(32, 32))) for i in range(4)])
    job = make_job(root)
    job.work.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(job.work)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        _fill(job.work)
        with pytest.raises(PipelineError) as err:  # prepare writes each shard's manifest rows there
            run_local(job, progress=False)
        [rows] = [p.name for p in (job.work / "convert" / "train").iterdir()] or [None]
    finally:
        subprocess.run(["umount", "-l", str(job.work)], check=True)
    assert rows is None  # no half-written slice under its final name, no temp file left
    message = str(err.value)
    assert message.startswith(f"{job.work / 'convert' / 'train'}: expected to write train-")
    assert ".rows.parquet here" in message
    assert "No space left on device (errno 28)" in message and "(paths.work in params.yaml names it)" in message


def test_a_write_error_in_the_reports_names_the_directory(tmp_path, monkeypatch):
    import errno

    from PIL import Image

    from tasks.validate import near_dup

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Image.Image, "save", full)
    with pytest.raises(PipelineError) as err:
        near_dup.write_near_duplicate_outputs({}, tmp_path / "parquet", tmp_path / "reports")
    _one_clear_line(err, tmp_path / "reports", "near_duplicates.png", "paths.reports")
    assert list((tmp_path / "reports").iterdir()) == []
