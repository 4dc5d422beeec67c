"""download stage as a Prefect flow: `python -m flows.download` (reads params.yaml `download`, `sample`, `paths`).

The network step (`fetch_archive`) is retried by Prefect when the transfer gave up after its own bounded
retries (each Prefect retry resumes from the `.part` file); a missing source, a 404 or a write failure is not."""
from __future__ import annotations

from typing import Any

from prefect import flow, task

from flows.cli import main
from tasks.acquire import download as dl
from tasks.common.params import load_params, paths
from tasks.acquire.md5state import CACHE_NAME


def _network_failure(_task: Any, _run: Any, state: Any) -> bool:
    try:
        state.result()
    except dl.RetryableError:
        return True
    except Exception:
        return False
    return False


check_local_sources = task(dl.check_local_sources, name="check-local-sources")
space_needed = task(dl.space_needed, name="space-needed")
check_free_space = task(dl.check_free_space, name="check-free-space")
fetch_sample = task(dl.fetch_sample, name="write-sample")
fetch_archive = task(dl.fetch_archive, name="fetch-archive", retries=2, retry_condition_fn=_network_failure)
write_download_json = task(dl.write_download_json, name="write-download-json")


@flow(name="download", log_prints=True)
def download_flow(params_file: str = "params.yaml") -> dict[str, dict[str, Any]]:
    params, sample = load_params("download", params_file), load_params("sample", params_file)
    where = paths(params_file)
    raw_dir, cache_file = where["raw"], where["work"] / CACHE_NAME
    opts = dl.FetchOptions.from_params(params)
    sources = dl.archive_sources(params)
    check_local_sources(sources)
    check_free_space(raw_dir, space_needed(sources, raw_dir, opts, cache_file))
    records = fetch_sample(raw_dir, sample, cache_file) if "sample" in sources.values() else {}
    fetch = fetch_archive.with_options(retry_delay_seconds=4 * opts.backoff_s)
    for name, source in sources.items():
        if source != "sample":
            records[name] = fetch(name, source, raw_dir, opts, cache_file)
    write_download_json(raw_dir, params, records)
    return records


if __name__ == "__main__":
    main(download_flow)
