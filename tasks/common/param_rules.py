"""Value rules the params models (tasks/common/param_sections.py) apply: no secret in a URL, every `paths:` entry
inside the project. Plain functions, used as pydantic validators there (and by anything else that must judge the
same values)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from pydantic import ValidationInfo

# Query keys that carry a secret: pre-signed S3 / GCS / Azure SAS / CloudFront URLs, token and API-key links.
SECRET_QUERY_KEYS = re.compile(
    r"(signature|credential|security-token|token|secret|password|passwd|api[-_]?key|access[-_]?key)"
    r"|^(sig|key|auth|policy|key-pair-id|googleaccessid)$",
    re.IGNORECASE,
)


def secrets_in(url: str) -> str | None:
    """What secret a URL carries, in words with the values redacted (None: none)."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        return "credentials in it (not shown)"
    keys = [key for key, _ in parse_qsl(parts.query, keep_blank_values=True) if SECRET_QUERY_KEYS.search(key)]
    if keys:
        return "a signed query ?" + "&".join(f"{key}=***" for key in keys) + " (values not shown)"
    return None


def in_project(value: str, info: ValidationInfo) -> str:
    """A `paths:` entry names a place inside the project: DVC tracks nothing outside the repository (an out there
    fails only after the stage ran), and no stage writes outside it. Relative entries are judged as written; an
    absolute one where the project root is known (load_project, the run form; `validate_params(root=...)`)."""
    root = (info.context or {}).get("root")
    path = Path(value).expanduser()
    if not path.is_absolute():
        inside = os.path.normpath(path)
    elif root is None:
        return value
    else:
        inside = os.path.relpath(os.path.normpath(path), os.path.abspath(root))
    if inside == "." or inside.split(os.sep)[0] == "..":
        where = "the project itself" if inside == "." else "outside the project"
        raise ValueError(
            f"expected a path inside the project{f' ({root})' if root else ''}, not the project itself, found "
            f"{value!r} ({where}); give a relative path under the project (mount a larger disk under it)"
        )
    return value
