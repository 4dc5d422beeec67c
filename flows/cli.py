"""Stage entry point helper: run a flow, turn a user-facing error into one clear paragraph and exit 1."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from tasks.common import PipelineError


def main(flow_fn: Callable[..., Any], *, user_errors: tuple[type[Exception], ...] = (), **kwargs: Any) -> None:
    """Run `flow_fn(**kwargs)` as the stage's command (what `dvc repro` calls).

    A PipelineError (or one of `user_errors`, e.g. imagenet_parquet's FormatError) already says what is wrong and
    what to do: it is printed without a traceback."""
    try:
        flow_fn(**kwargs)
    except (PipelineError, *user_errors) as err:
        print(f"\nerror: {err}", file=sys.stderr)
        raise SystemExit(1) from None
