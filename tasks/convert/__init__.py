"""Convert stage: manifests + label map -> Parquet shards (the format of imagenet_parquet.format).

Library use without Prefect: `run_local(job_from_params(...), workers=N)` (see the README's code map)."""

from tasks.convert.distribute import run_local
from tasks.convert.job import Job, job_from_params

__all__ = ["Job", "job_from_params", "run_local"]
