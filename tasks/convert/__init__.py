"""Convert stage: manifests + label map -> Parquet shards (the format of imagenet_parquet.format).

Library use without Prefect: `tasks.convert.distribute.run_local(tasks.convert.job.job_from_params(...))` (see the
README's code map). Nothing is imported here, so `tasks.convert.jpeg_header` alone stays cheap."""
