"""Stage entry point helper: validate params.yaml, run a flow, turn a user-facing error into one clear paragraph."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from tasks.common import PipelineError
from tasks.common.params import load_project
from tasks.common.prefect_server import shared_server
from tasks.common.runlock import claim_run


def main(
    flow_fn: Callable[..., Any],
    *,
    user_errors: tuple[type[Exception], ...] = (),
    check_params: bool = True,
    **kwargs: Any,
) -> None:
    """Run `flow_fn(**kwargs)` as the stage's command (what `dvc repro` calls).

    params.yaml is validated whole first, so a bad key fails in a second, before Prefect starts; then the stage
    claims the project's pipeline run (tasks.common.runlock: a second `dvc repro` at once is refused). A PipelineError
    (or one of `user_errors`, e.g. imagenet_parquet's FormatError) already says what is wrong and what to do: it is
    printed without a traceback, and the command exits 1.

    Without a configured Prefect API, the stages of one `dvc repro` share one server (tasks.common.prefect_server)
    instead of each starting Prefect's temporary one."""
    handled: tuple[type[Exception], ...] = (PipelineError, *user_errors)
    try:
        if check_params:
            project = load_project(kwargs.get("params_file", "params.yaml"))
            claim_run(project.path("work"), getattr(flow_fn, "name", None) or flow_fn.__name__)
        with prefect_api():
            no_traceback_for(handled)
            flow_fn(**kwargs)
    except handled as err:
        print(f"\nerror: {err}", file=sys.stderr)
        raise SystemExit(1) from None


class _StripTraceback(logging.Filter):
    """Drops the traceback from a log record whose exception is one of `errors` (it says what to do already)."""

    def __init__(self, errors: tuple[type[Exception], ...]) -> None:
        super().__init__()
        self.errors = errors

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], self.errors):
            record.exc_info, record.exc_text = None, None
        return True


def no_traceback_for(errors: tuple[type[Exception], ...]) -> None:
    """Prefect's flow engine logs a failed flow's exception with its traceback; for the user-facing errors the
    message is the whole story, so every handler of Prefect's loggers (and the root's) drops the traceback."""
    strip = _StripTraceback(errors)
    names = sorted(n for n in logging.root.manager.loggerDict if n.startswith("prefect"))
    for logger in [logging.getLogger(n) for n in names] + [logging.getLogger()]:
        for handler in logger.handlers:
            handler.addFilter(strip)


@contextlib.contextmanager
def prefect_api() -> Iterator[None]:
    """The configured Prefect API (PREFECT_API_URL, a profile), else the run's shared server for this process and
    its children."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    if get_current_settings().api.url:
        yield
        return
    with shared_server() as url, temporary_settings(updates={PREFECT_API_URL: url}):
        os.environ["PREFECT_API_URL"] = url  # worker processes (convert's pool) inherit it
        try:
            yield
        finally:
            os.environ.pop("PREFECT_API_URL", None)
