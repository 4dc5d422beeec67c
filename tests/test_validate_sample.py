"""The built-in sample through extract → convert → curate → validate (the stages' function APIs, no Prefect): it passes,
and the contact sheet shows every class of train and val."""
from __future__ import annotations

from PIL import Image

from tasks.common import ARCHIVES
from tasks.convert.distribute import run_local
from tasks.convert.job import job_from_params
from tasks.curate import stage as curate
from tasks.extract import stage as extract
from tasks.validate.contact_sheet import write_contact_sheet
from tasks.validate.report import write_reports
from tasks.validate.stage import raise_if_failed, run_validation
from tests.helpers.params import project


def test_sample_through_extract_convert_validate_passes(sample_release, tmp_path):
    # several row groups per shard: the streaming path is exercised
    setup = project(tmp_path, paths={"raw": str(sample_release)}, convert={"row_group_rows": 16})
    params, where = setup.params, setup.paths
    staging = where["work"] / "extract"
    for split in extract.SPLITS:
        extract.scan_archive_split(split, where["raw"] / ARCHIVES[split], staging, root=tmp_path)
    extract.finalize(staging, where["manifests"], where["label_map"], devkit_path=where["raw"] / ARCHIVES["devkit"])
    run_local(job_from_params(params.convert, where, root=tmp_path), progress=False)
    curate.write_overlays(curate.job_from_params(setup))  # no curation lines: the overlay changes nothing

    cfg = params.validation.model_copy(update={"decode_sample": "all"})
    report = run_validation(where["parquet"], where["manifests"], where["label_map"], cfg, where["overlay"])
    assert report["status"] == "pass", [c["message"] for c in report["checks"] if c["status"] != "pass"]
    assert report["near_duplicates"]["checked"] and report["near_duplicates"]["pairs"] == []  # synthetic: >= 16 bits
    sample = params.sample
    assert report["splits"]["train"]["rows"] + report["splits"]["train"]["quarantined"] == (
        sample.classes * sample.train_per_class)
    assert report["splits"]["val"]["decoded"] == report["splits"]["val"]["rows"] > 0
    assert report["class_counts"]["val"]["max"] == sample.val_per_class
    raise_if_failed(report, where["reports"])
    write_reports(report, where["reports"], where["metrics"] / "validate.json")
    sheet = write_contact_sheet(where["parquet"], where["label_map"], where["reports"] / "contact_sheet.png",
                                cfg.contact_sheet_per_class, cfg.contact_sheet_classes)
    with Image.open(sheet) as image:
        assert image.height >= sample.classes * 72
