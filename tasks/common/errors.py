"""The one user-facing error type of the pipeline."""

from __future__ import annotations


class PipelineError(RuntimeError):
    """A user-facing failure: the message names the file, what was expected, what was found, what to do."""
