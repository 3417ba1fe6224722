"""The JSON-schema synthesis set of the structured-output benchmarks: four schemas, and prompts a model
of Python sources continues with a record (`synthesis_rows`). Every string and number is bounded, so a
row that keeps to its schema ends well within the bench's `max_new_tokens`."""

from __future__ import annotations

from typing import Any

SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "admin": {"type": "boolean"},
        },
        "required": ["name", "age", "admin"],
        "additionalProperties": False,
    },
    "product": {
        "type": "object",
        "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "title": {"type": "string", "maxLength": 16},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        },
        "required": ["sku", "title", "tags"],
        "additionalProperties": False,
    },
    "event": {
        "type": "object",
        "properties": {
            "kind": {"enum": ["start", "stop", "error", "retry"]},
            "code": {"type": "integer", "minimum": 0, "maximum": 999},
            "message": {"type": "string", "maxLength": 20},
        },
        "required": ["kind", "code", "message"],
        "additionalProperties": False,
    },
    "point": {
        "type": "object",
        "properties": {
            "x": {"type": "integer", "minimum": -999, "maximum": 999},
            "y": {"type": "integer", "minimum": -999, "maximum": 999},
            "label": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
        },
        "required": ["x", "y", "label"],
        "additionalProperties": False,
    },
}
_SUBJECTS = ["config", "record", "entry", "item", "result", "sample", "value", "data"]


def synthesis_rows(count: int) -> list[tuple[str, str]]:
    """`count` (prompt, schema name) pairs, the schemas in turn, each prompt a line of Python about to
    load a record of that schema from JSON text."""
    names = list(SCHEMAS)
    rows = []
    for i in range(count):
        name, subject = names[i % len(names)], _SUBJECTS[(i // len(names)) % len(_SUBJECTS)]
        keys = ", ".join(SCHEMAS[name]["required"])
        rows.append((f"# {name} {i}: {keys}\n{subject}_{i} = json.loads('", name))
    return rows


def response_format(name: str) -> dict[str, Any]:
    """The OpenAI-shaped response_format of schema `name`."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name]}}
