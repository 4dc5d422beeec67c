"""download stage as a Prefect flow: `python -m flows.download` (reads params.yaml `download`, `sample`, `paths`).

The network step (`fetch_archive`) is retried by Prefect when the transfer gave up after its own bounded
retries (each Prefect retry resumes from the `.part` file); a missing source, a 404 or a write failure is not."""

from __future__ import annotations

from typing import Any

from tasks.acquire.unchanged import exit_if_unchanged

if __name__ == "__main__":
    exit_if_unchanged()  # before Prefect is imported: a no-op `dvc repro` starts no flow (tasks/acquire/unchanged.py)

from prefect import flow, get_run_logger, task

from flows.cli import main
from tasks.acquire import archive21k, download_json, local, obtain, space
from tasks.acquire import download as dl
from tasks.acquire.fetch import RetryableError
from tasks.common.files import remove_dead_temporaries
from tasks.common.params import load_project


def _network_failure(_task: Any, _run: Any, state: Any) -> bool:
    try:
        state.result()
    except RetryableError:
        return True
    except Exception:
        return False
    return False


check_local_sources = task(name="check-local-sources")(local.check_local_sources)
remove_stale_tars = task(name="remove-stale-tars")(archive21k.remove_stale_tars)
space_needed = task(name="space-needed")(dl.space_needed)
check_free_space = task(name="check-free-space")(space.check_free_space)
fetch_sample = task(name="write-sample")(obtain.fetch_sample)
fetch_archive = task(name="fetch-archive", retries=2, retry_condition_fn=_network_failure)(obtain.fetch_archive)
fetch_gzipped = task(name="fetch-and-decompress", retries=2, retry_condition_fn=_network_failure)(
    archive21k.fetch_gzipped
)
write_download_json = task(name="write-download-json")(download_json.write_download_json)


@flow(name="download", log_prints=True)
def download_flow(params_file: str = "params.yaml") -> dict[str, dict[str, Any]]:
    job = dl.plan(load_project(params_file))
    check_local_sources(job.sources, job.root, job.layout is not None)
    remove_stale_tars(job.raw_dir, set(job.sources) | set((job.layout or {}).values()), job.cache_file)
    for tmp in remove_dead_temporaries(job.raw_dir):  # a killed run's half-written archive (atomic_path's temporary)
        get_run_logger().info("%s: removed (left by a run that was killed)", tmp)
    # dvc.yaml keeps download.json (`persist`) so that a refused second `dvc repro` cannot delete it; this run
    # removes it itself, as DVC did: a failed run leaves none behind to stand for archives it may have changed
    (job.raw_dir / "download.json").unlink(missing_ok=True)
    needed = space_needed(job.sources, job.raw_dir, job.opts, job.cache_file, job.layout, job.root)
    check_free_space(job.raw_dir, needed)
    records = fetch_sample(job.raw_dir, job.sample, job.cache_file) if job.uses_sample else {}
    fetch = fetch_archive.with_options(retry_delay_seconds=4 * job.opts.backoff_s)
    for name, source in job.fetched().items():
        if job.gzipped:  # archive21k's .tar.gz: fetched, then decompressed once into its .tar
            records |= fetch_gzipped(name, source, job.raw_dir, job.opts, job.cache_file, job.root)
            continue
        records[name] = fetch(name, source, job.raw_dir, job.opts, job.cache_file, job.root, job.split_of.get(name))
    write_download_json(job.raw_dir, job.source, records, job.folder, job.layout)
    return records


if __name__ == "__main__":
    main(download_flow)
