"""Pydantic validation errors in the words of a PipelineError: `<where>: expected <what the field takes>, found
<value>` — one mechanism for every input the pipeline checks against a model: params.yaml (tasks/common/params.py)
and the JSON state it keeps in git or beside its outputs (the layout history, tasks/convert/history_schema.py; the
compaction marker, tasks/curate/compact_out.py). The rules stay data (the models' types, bounds, patterns and
descriptions); what a field takes is worded from the model's JSON schema (`describe`, `expected`)."""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

# A union's member, as pydantic adds it to an error's location (`classes.list[constrained-str]`): not a key.
UNION_TAG = re.compile(r"^(constrained-)?(str|int|float|bool|list\[.*\]|dict\[.*\])$")
SHOWN = 120  # characters of a found value a line shows at most (a whole list of shards is no help)


def describe(schema: dict[str, Any]) -> str:
    """What a JSON schema accepts, in words: `an integer in [1, 100]`, `one of passthrough, reencode`, ..."""
    options = schema.get("anyOf", [])
    if {option.get("type") for option in options} == {"integer", "number"}:  # int | float: a number
        schema = {**{k: v for k, v in schema.items() if k != "anyOf"}, "type": "number"}
    elif options:
        return " or ".join(describe(option) for option in options)
    if "enum" in schema or "const" in schema:
        return "one of " + ", ".join(str(v) for v in schema.get("enum", [schema.get("const")]))
    kind = schema.get("type")
    if kind == "array" and "minItems" in schema and schema.get("minItems") == schema.get("maxItems"):
        return f"a list of {schema['minItems']} values"
    words = {
        "integer": "an integer",
        "number": "a number",
        "boolean": "true or false",
        "null": "null",
        "string": "text",
        "array": "a list",
        "object": "a mapping",
    }.get(str(kind), "a value")
    low, high = schema.get("minimum", schema.get("ge")), schema.get("maximum", schema.get("le"))
    above = schema.get("exclusiveMinimum", schema.get("gt"))
    below = schema.get("exclusiveMaximum")
    if above is not None:
        return f"{words} > {above}" + (f" and <= {high}" if high is not None else f" and < {below}" if below else "")
    if low is not None and high is not None:
        return f"{words} in [{low}, {high}]"
    if low is not None:
        return f"{words} >= {low}"
    return f"{words} <= {high}" if high is not None else words


def expected(schema: dict[str, Any] | None) -> str:
    """What a field takes: its description when it is free text or a mapping (what it may hold), else its type's
    words (`describe`); `a value` for no field."""
    if schema is None:
        return "a value"
    options = [option.get("type", "object" if "$ref" in option else None) for option in schema.get("anyOf", [schema])]
    untyped = not {"type", "anyOf", "$ref", "const", "enum"} & set(schema)  # a mapping's key names, say
    free = untyped or bool({"string", "array", "object"} & set(options))
    if "description" in schema and free and "enum" not in schema:
        description: str = schema["description"]
        return description + (" or null" if "null" in options else "")
    return describe(schema)


def key_path(loc: Sequence[Any]) -> list[str]:
    """An error's location as keys and positions (strings), without pydantic's union members."""
    return [str(p) for p in loc if not UNION_TAG.match(str(p))]


def dotted(loc: Sequence[str]) -> str:
    """A location as dotted keys; a mapping's key refused as `<mapping>: the key '<key>'`."""
    if len(loc) >= 2 and loc[-1] == "[key]":
        return f"{'.'.join(loc[:-2]) or 'the document'}: the key {shown(loc[-2])}"
    return ".".join(loc)


def message(error: Any) -> str:
    """A validator's own message (a rule that words its problem itself)."""
    return str(error["msg"]).removeprefix("Value error, ")


def shown(value: Any) -> str:
    """A found value as a line shows it: its repr, cut at SHOWN characters."""
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[: SHOWN - 5]}...{text[-2:]}"


def problem(error: Any, where: str, takes: Callable[[], str], known: Callable[[], list[str]]) -> str:
    """One error as `where: ...`: an unknown key (and the closest `known` one), a missing one, a validator's own
    message, or `expected <takes()>, found <value>`."""
    kind = error["type"]
    if kind == "extra_forbidden":
        names = known()
        close = difflib.get_close_matches(str(error["loc"][-1]), names, n=1)
        return f"{where}: unknown key" + (f" (did you mean {close[0]}?)" if close else f" (expected one of {names})")
    if kind == "missing":
        return f"{where}: missing; expected {takes()}"
    if kind == "value_error":
        return f"{where}: {message(error)}"
    return f"{where}: expected {takes()}, found {shown(error.get('input'))}"


@functools.lru_cache(maxsize=16)
def _json_schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def field_schema(model: type[BaseModel], loc: Sequence[str]) -> dict[str, Any] | None:
    """The JSON schema of the field at `loc` (keys and list positions, `[key]` for a mapping's key) in `model`;
    None where the location names no field."""
    root = _json_schema(model)
    if len(loc) >= 2 and loc[-1] == "[key]":  # the key `loc[-2]` of the mapping at `loc[:-2]`
        names = (field_schema(model, loc[:-2]) or {}).get("propertyNames")
        return _resolved(root, names) if isinstance(names, dict) else None
    node: dict[str, Any] | None = root
    for part in loc:
        node = _step(_resolved(root, node), part, root)
        if node is None:
            return None
    return _resolved(root, node)


def _resolved(root: dict[str, Any], node: dict[str, Any] | None) -> dict[str, Any] | None:
    while node is not None and "$ref" in node:
        node = root.get("$defs", {}).get(node["$ref"].rsplit("/", 1)[-1])
    return node


def _step(node: dict[str, Any] | None, part: str, root: dict[str, Any]) -> dict[str, Any] | None:
    if node is None:
        return None
    for option in node.get("anyOf", []):
        found = _step(_resolved(root, option), part, root)
        if found is not None:
            return found
    if part in node.get("properties", {}):
        return dict(node["properties"][part])
    if part.isdigit() and "items" in node:
        return dict(node["items"])
    extra = node.get("additionalProperties")
    return dict(extra) if isinstance(extra, dict) else None


def model_problems(model: type[BaseModel], err: ValidationError, where: Callable[[list[str]], str]) -> list[str]:
    """Every problem of `err` (from validating against `model`), sorted, each once; `where(loc)` names the place."""
    lines = []
    for error in err.errors():
        loc = key_path(error["loc"])
        known = sorted((field_schema(model, loc[:-1]) or {}).get("properties", {}))
        takes = expected(field_schema(model, loc))
        lines.append(problem(error, where(loc), lambda: takes, lambda: known))  # noqa: B023 (called at once)
    return sorted(dict.fromkeys(lines))
