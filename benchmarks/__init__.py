"""Benchmarks: run from the repository root as `python -m benchmarks.<name>` (docs/contributor.md lists them)."""
