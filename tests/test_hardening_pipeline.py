"""Hardening of the pipeline (issue 21, items 8-13): signed URLs refused in params, bounded params and paths inside
the project, a padded decompression bomb quarantined and refused by the reader, a full disk named in one line,
changes.json counted from the curation key sets, curation errors naming the curation line."""
from __future__ import annotations

import pytest

from tasks.acquire import download as dl
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
        opts = dl.FetchOptions(retries=0, backoff_s=0.01, timeout_s=2.0, chunk_bytes=64 << 10, progress=False)
        dl.fetch_archive(VAL, f"{server.url}/missing.tar", tmp_path / "raw", opts, tmp_path / "md5_cache.json")
    message = str(err.value)
    assert "found HTTP 404" in message and "~/.netrc" in message
    assert "user:password in the URL" not in message and "refuses them in the URL" in message
