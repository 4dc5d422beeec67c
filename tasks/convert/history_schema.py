"""The layout history's schema (`<paths.versions>/layout.json`, tasks/convert/history.py), as data: the models below
(every field's type and range, unknown keys refused) and the rules across fields (`RULES`: generations numbered 0,
1, ... in order; every shard named by the contract, `SHARD_NAMES`, of its own split and generation, and named once;
each quarantined record of its own split). The file is tracked in git — edited by hand, merged, rebased, checked
out at other revisions — so it is checked whole before convert reads a shard or writes a byte: a problem is one
PipelineError line naming the file, the generation and the field, what was expected and what was found
(tasks/common/model_errors.py words it, as it words params.yaml's). What the shards themselves must agree with
(rows, sizes, md5) is checked when they are read (history.py `known_rows`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tasks.common import PipelineError
from tasks.common.files import json_problem, read_json_strict
from tasks.common.model_errors import dotted, model_problems, shown
from tasks.convert.plan import SHARD_NAMES, SHARD_STEMS, shard_name_ok

HISTORY_FORMAT = 1
MAX_BYTES = 64 << 20  # ~200 bytes a shard: 1.3 M images at shard_mb 4 is ~0.1 MB of history
INT64 = 2**63 - 1  # every count and size is an int64 in the shards, the metrics and numpy
DISCARD = "run `make relayout` (or `python -m tasks.convert.history discard`) to drop it and convert the current "
DISCARD += "source from scratch (the canonical layout), or restore the file from git (`git checkout -- <file>`)"

Count = Annotated[int, Field(ge=0, le=INT64)]
Split = Literal["train", "val"]  # tasks.common.SPLITS (tests/test_history_schema.py keeps them equal)


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ShardEntry(_Entry):
    name: str = Field(description=f"the shard's file name, {SHARD_NAMES}")
    rows: Count = Field(description="the rows its footer holds")
    file_bytes: Annotated[int, Field(ge=1, le=INT64)] = Field(description="the file's size")
    image_bytes: Count = Field(description="the bytes of its stored images (its footer byte index)")
    input_bytes: Count = Field(description="the bytes of the source images it was converted from")
    md5: str = Field(pattern="^[0-9a-f]{32}$", description="32 lowercase hex digits (the file's MD5, its DVC name)")


class BadRecord(_Entry):
    """A quarantined image's bad_images.jsonl line (tasks/convert/stage.py `_encoded_rows`)."""

    split: Split
    source: str = Field(description="text (the archive or file the image was read from)")
    member: str = Field(description="text (its member in that archive)")
    name: str = Field(min_length=1, description="the image's manifest name (non-empty text)")
    reason: str = Field(description="text (why it was quarantined)")


class BadEntry(_Entry):
    record: BadRecord
    class_: str = Field(alias="class", min_length=1, description="the image's class id (non-empty text)")


class Generation(_Entry):
    generation: Count
    shards: list[ShardEntry]
    bad: list[BadEntry]


GENERATIONS = "a list of the split's generations (at least one): generation, shards, bad"


class LayoutHistory(_Entry):
    format: Annotated[int, Field(ge=HISTORY_FORMAT, le=HISTORY_FORMAT, json_schema_extra={"const": HISTORY_FORMAT})]
    identity: str = Field(pattern="^[0-9a-f]{64}$", description="64 lowercase hex digits (the output identity)")
    splits: dict[Split, Annotated[list[Generation], Field(min_length=1, description=GENERATIONS)]] = Field(
        description="a mapping of split (train, val) to its generations, at least one"
    )


Problem = tuple[list[Any], str, Any]  # (location, what was expected, what was found)


def parse_history(path: Path) -> dict[str, Any]:
    """The layout history at `path` (a file there) as checked JSON, or one PipelineError line naming the problem."""
    try:
        doc = read_json_strict(path, MAX_BYTES)
    except (OSError, ValueError) as err:
        raise PipelineError(
            f"{path}: expected the layout history convert writes (JSON, format {HISTORY_FORMAT}: identity, splits -> "
            f"generations of shards), found {json_problem(err)}; {DISCARD.replace('<file>', str(path))}"
        ) from None
    try:
        LayoutHistory.model_validate(doc)
    except ValidationError as err:
        _refuse(path, model_problems(LayoutHistory, err, lambda loc: where(loc, doc)))
    _refuse(path, [f"{where(loc, doc)}: expected {wanted}, found {shown(found)}" for loc, wanted, found in rules(doc)])
    return dict(doc)


def _refuse(path: Path, problems: list[str]) -> None:
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise PipelineError(f"{path}: {problems[0]}{more}; {DISCARD.replace('<file>', str(path))}")


def rules(doc: dict[str, Any]) -> Iterator[Problem]:
    """Every problem across fields of a history that has the models' shape (RULES, in order)."""
    for split, generations in doc["splits"].items():
        for rule in RULES:
            yield from rule(split, generations)


def _numbered(split: str, generations: list[dict[str, Any]]) -> Iterator[Problem]:
    for number, gen in enumerate(generations):
        if gen["generation"] != number:
            yield ["splits", split, number, "generation"], f"{number} (0, 1, ... in order)", gen["generation"]


def _named(split: str, generations: list[dict[str, Any]]) -> Iterator[Problem]:
    first: dict[str, int] = {}
    for number, gen in enumerate(generations):
        for index, shard in enumerate(gen["shards"]):
            loc, name = ["splits", split, number, "shards", index, "name"], shard["name"]
            if not shard_name_ok(name, split, number):
                prefix = f"{split}-g{number}-" if number else f"{split}-"
                yield loc, f"a name {prefix}<stem>.parquet ({SHARD_STEMS})", name
            elif name in first:
                yield loc, f"a name no other shard has (generation {first[name]} lists it too)", name
            first.setdefault(name, number)


def _own_split(split: str, generations: list[dict[str, Any]]) -> Iterator[Problem]:
    for number, gen in enumerate(generations):
        for index, bad in enumerate(gen["bad"]):
            if bad["record"]["split"] != split:
                yield ["splits", split, number, "bad", index, "record", "split"], repr(split), bad["record"]["split"]


def _quarantined_once(split: str, generations: list[dict[str, Any]]) -> Iterator[Problem]:
    """An image is quarantined once (never retried while it is recorded): a second record counts it twice."""
    first: dict[tuple[str, str], int] = {}
    for number, gen in enumerate(generations):
        for index, bad in enumerate(gen["bad"]):
            key = (bad["class"], bad["record"]["name"])
            if key in first:
                loc = ["splits", split, number, "bad", index, "record", "name"]
                yield loc, f"an image no other bad entry names (generation {first[key]} names it too)", key[1]
            first.setdefault(key, number)


RULES: tuple[Callable[[str, list[dict[str, Any]]], Iterator[Problem]], ...] = (
    _numbered,
    _named,
    _own_split,
    _quarantined_once,
)


def where(loc: list[Any], doc: Any) -> str:
    """A location in the history in words: `train generation 1, shard 0 ('train-g1-h….parquet'), rows`."""
    parts = [str(p) for p in loc]
    if len(parts) < 3 or parts[0] != "splits" or not parts[2].isdigit():
        return dotted(parts)
    head = f"{parts[1]} generation {parts[2]}"
    rest = parts[3:]
    if len(rest) >= 2 and rest[0] in ("shards", "bad") and rest[1].isdigit():
        head += f", {rest[0][:-1] if rest[0] == 'shards' else 'bad'} {rest[1]}{_named_as(doc, parts[:5])}"
        rest = rest[2:]
    return ", ".join([head, ".".join(rest)]) if rest else head


def _named_as(doc: Any, loc: list[str]) -> str:
    """` (<shard name>)` where the entry at `loc` has a name (its record's, for a bad entry)."""
    node = doc
    for part in loc:
        node = (
            node[int(part)]
            if isinstance(node, list) and part.isdigit() and int(part) < len(node)
            else (node.get(part) if isinstance(node, dict) else None)
        )
    if isinstance(node, dict) and isinstance(node.get("record"), dict):
        node = node["record"]
    name = node.get("name") if isinstance(node, dict) else None
    return f" ({shown(name)})" if isinstance(name, str) else ""
