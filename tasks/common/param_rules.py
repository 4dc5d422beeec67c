"""Value rules the params models (tasks/common/param_sections.py) apply: no secret in a URL, every `paths:` entry
inside the project, every curation file a tracked input of the curate stage. Plain functions and data, used as
pydantic validators there, by the run form (tasks/deploy/run_form.py, whose fields take these models' types) and
by the JSON schema the Prefect server checks a run against (anything else that must judge the same values too)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from pydantic import GetJsonSchemaHandler, ValidationInfo
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

# Query keys that carry a secret: pre-signed S3 / GCS / Azure SAS / CloudFront URLs, token and API-key links.
SECRET_QUERY_KEYS = re.compile(
    r"(signature|credential|security-token|token|secret|password|passwd|api[-_]?key|access[-_]?key)"
    r"|^(sig|key|auth|policy|key-pair-id|googleaccessid)$",
    re.IGNORECASE,
)


# The curation files (params.yaml curate.exclude / curate.relabel) live under this directory, which dvc.yaml lists
# as a dependency of the curate stage (tests/test_params.py checks it): an edit reruns curate, `dvc status` sees it.
# A relative path below it whose every component is a plain name (no `..`, `.`, hidden or empty component).
CURATION_DIR = "curation"
CURATION_PATTERN = rf"^{CURATION_DIR}(/[^/.][^/]*)+$"


def curation_file(value: str) -> str:
    """A curation file is a tracked input of the curate stage: a relative path under CURATION_DIR/."""
    if not re.fullmatch(CURATION_PATTERN, value):
        raise ValueError(
            f"expected a relative path under {CURATION_DIR}/ (the curate stage's dependency in dvc.yaml: an edit "
            f"reruns the stage), found {value!r}; move the file into {CURATION_DIR}/ and give its path there"
        )
    return value


@dataclass(frozen=True)
class JsonPattern:
    """Annotation metadata: the regular expression a text value matches, written into the JSON schema (the Prefect
    server refuses a run form value that breaks it); the model's own validator gives the message."""

    pattern: str

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        found = handler(schema)
        found["pattern"] = self.pattern
        return found


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
