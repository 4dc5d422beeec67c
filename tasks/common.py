"""Shared helpers: params, paths, atomic outputs, deterministic JSON."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

DATA_DIR = Path(__file__).with_name("data")  # facts the product ships (synsets, MD5 tables, subsets)
SPLITS = ("train", "val")  # every split the pipeline writes, in this order
ARCHIVES = {
    "train": "ILSVRC2012_img_train.tar",
    "val": "ILSVRC2012_img_val.tar",
    "devkit": "ILSVRC2012_devkit_t12.tar.gz",
}


class PipelineError(RuntimeError):
    """A user-facing failure: the message names the file, what was expected, what was found, what to do."""


def load_params(section: str | None = None, params_file: str | os.PathLike = "params.yaml") -> dict[str, Any]:
    """Return one section of params.yaml (or the whole file when section is None)."""
    with open(params_file, encoding="utf-8") as fh:
        params = yaml.safe_load(fh) or {}
    if section is None:
        return params
    if section not in params:
        raise PipelineError(f"{params_file}: expected a '{section}:' section, found sections {sorted(params)}")
    return params[section]


def paths(params_file: str | os.PathLike = "params.yaml") -> dict[str, Path]:
    """The `paths:` section of params.yaml as Path objects (the one place paths are stated)."""
    return {key: Path(value) for key, value in load_params("paths", params_file).items()}


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling path; rename it onto `final` only if the block succeeds.

    A reader (or DVC) never sees a half-written file or directory under the final name."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def dumps_json(obj: Any) -> str:
    """Deterministic JSON text: sorted keys, fixed indent, trailing newline."""
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Atomically write deterministic JSON."""
    with atomic_path(path) as tmp:
        tmp.write_text(dumps_json(obj), encoding="utf-8")
    return Path(path)
