"""The download and verify Prefect flows against a real Prefect server and the faulty HTTP server."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.download import download_flow
from flows.verify import verify_flow
from tasks.common import ARCHIVES, PipelineError
from tests.helpers.params import write_params
from tests.helpers.servers import RangeServer


def _params(tmp_path: Path, source: str, checksums: str) -> Path:
    """params.yaml under tmp_path: relative paths (raw, work) resolve against it, whatever the working directory."""
    return write_params(tmp_path, paths={"raw": "raw", "work": "work"},
                        sample={"classes": 2, "train_per_class": 2, "val_per_class": 1, "seed": 0},
                        download={"source": source, "retries": 0, "backoff_s": 0.01, "timeout_s": 60,
                                  "chunk_mb": 0.0625},
                        verify={"checksums": checksums})


def test_http_download_retried_by_prefect_then_verified_without_rehashing(prefect_api, sample_release, tmp_path):
    train = f"/{ARCHIVES['train']}"
    with RangeServer(sample_release) as server:
        server.faults[train].append(("drop", 100_000))  # retries: 0, so only Prefect's task retry can save it
        params = _params(tmp_path, server.url + "/", str(sample_release / "sample_md5.tsv"))
        records = download_flow(params_file=str(params))
    assert [r for m, p, r in server.requests if m == "GET" and p == train] == [None, "bytes=100000-"]
    expected = dict(line.split("\t") for line in (sample_release / "sample_md5.tsv").read_text().split("\n")[1:-1])
    assert {name: r["md5"] for name, r in records.items()} == expected
    result = verify_flow(params_file=str(params))
    assert {r["md5_from"] for r in result["archives"].values()} == {f"download {server.url}/{n}" for n in expected}
    verdict = json.loads((tmp_path / "raw" / "verify.json").read_text())
    assert verdict["checksums"] == str(sample_release / "sample_md5.tsv")
    assert {name: a["md5"] for name, a in verdict["archives"].items()} == expected


def test_missing_archive_is_not_retried_and_sample_source_verifies(prefect_api, tmp_path):
    with RangeServer(tmp_path) as server:
        with pytest.raises(PipelineError, match="found HTTP 404"):
            download_flow(params_file=str(_params(tmp_path, server.url, "auto")))
    assert sum(m == "GET" for m, _p, _r in server.requests) == 0  # the free-space probe (HEAD) failed first
    download_flow(params_file=str(_params(tmp_path, "sample", "auto")))
    assert verify_flow(params_file=str(tmp_path / "params.yaml"))["checksums"] == "sample"
