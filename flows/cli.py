"""Stage entry point helper: validate params.yaml, run a flow, turn a user-facing error into one clear paragraph."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from tasks.common import PipelineError
from tasks.common.params import load_project


def main(
    flow_fn: Callable[..., Any],
    *,
    user_errors: tuple[type[Exception], ...] = (),
    check_params: bool = True,
    **kwargs: Any,
) -> None:
    """Run `flow_fn(**kwargs)` as the stage's command (what `dvc repro` calls).

    params.yaml is validated whole first, so a bad key fails in a second, before Prefect starts. A PipelineError
    (or one of `user_errors`, e.g. imagenet_parquet's FormatError) already says what is wrong and what to do: it is
    printed without a traceback, and the command exits 1."""
    handled: tuple[type[Exception], ...] = (PipelineError, *user_errors)
    try:
        if check_params:
            load_project(kwargs.get("params_file", "params.yaml"))
        flow_fn(**kwargs)
    except handled as err:
        print(f"\nerror: {err}", file=sys.stderr)
        raise SystemExit(1) from None
