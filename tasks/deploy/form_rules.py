"""Cross-field rules of the run form (tasks.deploy.run_form): checked by the model in the flow run AND written into
its JSON schema, so the Prefect server refuses a run that breaks one before the run is created."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any


@dataclass(frozen=True)
class Rule:
    """When field `when` has one of `when_in` (None: is set), field `then` must have one of `then_in` (None: be set)."""

    when: str
    when_in: tuple[str, ...] | None
    then: str
    then_in: tuple[str, ...] | None
    message: str


def holds(value: Any, allowed: tuple[str, ...] | None) -> bool:
    value = value.value if isinstance(value, Enum) else value
    return value not in (None, "") if allowed is None else value in allowed


def broken(rules: Sequence[Rule], form: Any) -> list[str]:
    """The messages of the rules `form` (an object with the fields as attributes) breaks."""
    return [
        r.message
        for r in rules
        if holds(getattr(form, r.when), r.when_in) and not holds(getattr(form, r.then), r.then_in)
    ]


def _schema_condition(field: str, allowed: tuple[str, ...] | None) -> dict[str, Any]:
    check = {"not": {"enum": [None, ""]}} if allowed is None else {"enum": list(allowed)}
    return {"properties": {field: check}, "required": [field]}


def rules_schema(schema: dict[str, Any], rules: Sequence[Rule]) -> None:
    """Add the rules to a JSON schema as `allOf` if/then conditions."""
    schema["allOf"] = [
        {"if": _schema_condition(r.when, r.when_in), "then": _schema_condition(r.then, r.then_in)} for r in rules
    ]
