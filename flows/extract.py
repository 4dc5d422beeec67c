"""Extract flow: index the verified archives (or an ImageFolder tree) into manifests + the label map.

`python -m flows.extract` (the dvc.yaml `extract` stage) reads `params.yaml: extract` and `paths`."""
from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.cli import main
from tasks.extract import materialize as imagefolder, stage as extract
from tasks.common import ARCHIVES
from tasks.common.params import load_params, paths

scan_archive = task(extract.scan_archive_split, name="scan-archive", cache_policy=NO_CACHE)
scan_folder = task(extract.scan_folder_split_to, name="scan-folder", cache_policy=NO_CACHE)
finalize = task(extract.finalize, name="write-manifests", cache_policy=NO_CACHE)
materialize = task(imagefolder.materialize, name="materialize-imagefolder", cache_policy=NO_CACHE)


@flow(name="extract")
def extract_flow(params_file: str = "params.yaml") -> dict[str, Any]:
    cfg, where = load_params("extract", params_file), paths(params_file)
    extract.check_params(cfg)
    staging, tree = where["work"] / "extract", where["work"] / "imagefolder"
    archives = cfg["mode"] == "archives"
    if archives:
        scans = [scan_archive.submit(split, where["raw"] / ARCHIVES[split], staging) for split in extract.SPLITS]
    else:
        scans = [scan_folder.submit(split, cfg["folder"], staging) for split in extract.SPLITS]
    for scan in scans:
        scan.result()  # re-raises a scan's PipelineError
    materialized = cfg["materialize"] and archives
    report = finalize(staging, where["manifests"], where["label_map"], mode=cfg["mode"],
                      val_labels=cfg["val_labels"], classes=cfg["classes"],
                      devkit_path=where["raw"] / ARCHIVES["devkit"], imagefolder=str(tree) if materialized else None)
    logger = get_run_logger()
    if cfg["materialize"] and not archives:
        logger.warning("extract.materialize ignored in folder mode: the input already is an ImageFolder tree")
    if materialized:
        logger.info("ImageFolder tree written to %s: %s files", tree, materialize(where["manifests"], tree))
    logger.info("manifests: %s images, %d classes, %d reported files (see %s)", report["images"],
                report["num_classes"], len(report["reported"]), where["manifests"] / "extract_report.json")
    return report


if __name__ == "__main__":
    main(extract_flow)
