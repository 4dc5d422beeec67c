"""Helpers shared by the tests (and the benchmarks), imported as `from tests.helpers.<module> import ...`.

images       small image payloads: solid and noisy JPEGs, self-identifying JPEGs, fake (undecodable) JPEG bytes
archives     ILSVRC2012-shaped tars and devkits, tar member offsets, the extract stage run without Prefect
datasets     convert inputs (manifests + label map) and jobs, validate datasets, reader shards (contract schema)
params       the repository's params.yaml with overrides, typed by the stages' own models
project      the repository paths and a fresh git + DVC copy of the working tree
servers      free ports, HTTP waits, the faulty Range HTTP server, a real Prefect server and pointing Prefect at it
deployments  the pipeline's deployment served from a project copy; runs, logs and artifacts read back from the API

Nothing here imports prefect at module level: tests/conftest.py isolates Prefect's home before anything does."""
