"""The checks of the shards as converted, kept while no shard changed: a curation round re-checks only the merged view.

What validate finds in the shards as converted depends on the shards' bytes, the label map, the overlay's format and
the manifests alone, never on the curation lines: the schema and pandera checks (`stage._shard_checks`) with the
version index's per-shard digests (`changes.shard_digests`), kept in `converted.json`; the shard rows against the
manifests (`manifest_totals`, `labels_match_manifest` and the split totals), kept in `manifests.json` — both in
`<paths.work>/validate` (scratch, never an output). At 1.33 M rows they cost ~15 of validate's ~31 CPU-s
(docs/results/bench-full-count.txt); a curation round changes none of their inputs.

Each is kept under a key read before the shards and manifests are: each shard's split, name, size, mtime, inode and
footer SHA-256 (the key of the byte findings, tasks/validate/scan.py), the label map's digest, the overlay format,
the report's example count, the versions of the rules, pandera and pandas; for `manifests.json` also the SHA-256
of each manifest and of bad_images.jsonl. Any difference, an unreadable or foreign file: everything is checked
again; the report is the same either way (tests/test_validate_scan_cache.py)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pandera

from tasks.common import SPLITS, write_json
from tasks.common.files import UnfitFile, read_small_text
from tasks.common.manifests import manifest_path
from tasks.validate.changes import label_map_digest
from tasks.validate.checks import DESCRIPTIONS, CheckResult
from tasks.validate.kept_metadata import shard_identity

CONVERTED_FILE, MANIFESTS_FILE = "converted.json", "manifests.json"
RULES_VERSION = 1  # bump when a check kept here, the shard digest or the split totals change
MAX_BYTES = 64 << 20  # larger: not a file this module wrote
Kept = tuple[list[CheckResult], dict[str, Any]]  # check results, and what goes with them (digests, totals)


class KeptChecks:
    """The kept documents of one validation under `directory` (`<paths.work>/validate`; None: nothing kept)."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | None,
        shards: dict[str, list[Path]],
        label_map: dict[str, Any],
        format2: bool,
        limit: int,
        inputs: list[Path],
    ) -> None:
        """Keys read now, before the shards (`shards`: split -> paths) and the `inputs` (the manifests and
        bad_images.jsonl) are."""
        self.directory = Path(directory) if directory is not None else None
        base = shards_key(shards, label_map, format2, limit) if self.directory is not None else None
        self.keys = {CONVERTED_FILE: base, MANIFESTS_FILE: _with_inputs(base, inputs)}

    def load(self, name: str) -> Kept | None:
        """The results kept in `name` under this run's key; None: none, another key, unfit (`extra` included:
        a dict of splits, each a dict of text keys to text (shard digests) or to whole numbers (totals))."""
        key = self.keys[name]
        if self.directory is None or key is None:
            return None
        try:
            text = read_small_text(self.directory / name, MAX_BYTES)
        except (OSError, UnfitFile):
            return None
        return parse_kept(text, key)

    def store(self, name: str, results: list[CheckResult], extra: dict[str, Any]) -> None:
        key = self.keys[name]
        if self.directory is not None and key is not None:
            doc = {"key": key, "results": [_plain_result(r) for r in results], "extra": extra}
            write_json(self.directory / name, doc, key="paths.work")


def shards_key(
    shards: dict[str, list[Path]], label_map: dict[str, Any], format2: bool, limit: int
) -> dict[str, Any] | None:
    """What the checks of the shards as converted depend on; None when a shard cannot be keyed (then nothing is
    kept or reused)."""
    found = []
    for split in SPLITS:
        for path in shards.get(split, []):
            identity = shard_identity(path)
            if identity is None:
                return None
            found.append({"split": split, **identity})
    return {
        "rules": RULES_VERSION,
        "pandera": pandera.__version__,
        "pandas": pd.__version__,
        "label_map": label_map_digest(label_map),
        "format2_overlay": format2,
        "report_examples": limit,
        "shards": found,
    }


def _with_inputs(key: dict[str, Any] | None, inputs: list[Path]) -> dict[str, Any] | None:
    """`key` and the SHA-256 of each file of `inputs` (None: a file missing or unreadable)."""
    if key is None:
        return None
    digests = []
    for path in inputs:
        try:
            with open(path, "rb") as fh:
                digests.append([path.name, hashlib.file_digest(fh, "sha256").hexdigest()])
        except OSError:
            return None
    return {**key, "inputs": digests}


def manifest_inputs(manifests_dir: Path, bad_images: Path) -> list[Path]:
    return [*(manifest_path(manifests_dir, split) for split in SPLITS), bad_images]


def parse_kept(text: str, key: dict[str, Any]) -> Kept | None:
    """The kept results in `text` when they were kept under `key` and have the shape `store` writes."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("key") != key:
        return None
    results, extra = doc.get("results"), doc.get("extra")
    if not isinstance(results, list) or not all(map(_is_result, results)) or not isinstance(extra, dict):
        return None
    if not _is_extra(extra):
        return None
    return [CheckResult(**{**r, "examples": [dict(e) for e in r["examples"]]}) for r in results], extra


_FIELDS = {"name": str, "status": str, "message": str, "failures": int, "examples": list}


def _is_result(found: Any) -> bool:
    return (
        isinstance(found, dict)
        and set(found) == set(_FIELDS)
        and all(isinstance(found[k], t) for k, t in _FIELDS.items())
        and found["name"] in DESCRIPTIONS
        and found["status"] in ("pass", "warn", "fail")
        and all(isinstance(e, list) and all(_is_pair(p) for p in e) for e in found["examples"])
    )


def _is_extra(found: dict[str, Any]) -> bool:
    return all(
        split in SPLITS
        and isinstance(part, dict)
        and all(isinstance(k, str) and type(v) in (str, int) for k, v in part.items())
        for split, part in found.items()
    )


def _is_pair(found: Any) -> bool:
    return isinstance(found, list) and len(found) == 2 and isinstance(found[0], str)


def _plain_result(result: CheckResult) -> dict[str, Any]:
    """The result as JSON keeps it: each example row a list of [column, value] (the report's column order; the
    file is written with sorted keys)."""
    examples = [[[k, v] for k, v in e.items()] for e in result.examples]
    return {**{k: getattr(result, k) for k in _FIELDS}, "examples": examples}
