"""Stage entry point helper: run a flow, turn a PipelineError into a clear one-paragraph error and exit 1."""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from tasks.common import PipelineError


def main(flow_fn: Callable[..., Any], **kwargs: Any) -> None:
    """Run `flow_fn(**kwargs)` as the stage's command (what `dvc repro` calls)."""
    try:
        flow_fn(**kwargs)
    except PipelineError as err:
        print(f"\nerror: {err}", file=sys.stderr)
        raise SystemExit(1) from None
