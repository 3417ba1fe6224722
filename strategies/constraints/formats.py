"""`response_format` values, in OpenAI's shape and three more: what a job's or a row's format says, checked
and written canonically, before any tokenizer or grammar engine is at hand (the driver checks the job's
format with this module alone; `strategies.constraints.grammars` compiles it in the actor).

    {"type": "text"}                                               no constraint
    {"type": "json_object"}                                        any JSON object
    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}   JSON valid under `schema`
    {"type": "regex", "pattern": "..."}                            text matching the regular expression
    {"type": "choice", "choices": ["...", ...]}                    exactly one of the strings
    {"type": "grammar", "ebnf": "..."}                             text of the grammar (llguidance's Lark dialect)

The canonical form (`canonical`) is compact JSON with only what shapes the grammar (a schema's `name`
and `strict` do not), so equal formats share one compiled grammar per actor; it is a format itself
(`canonical` of it is itself). A schema keeps its keys' order: an object's properties are written in
the order its schema declares them, as OpenAI's structured outputs write them, and a prompt that lists
the fields in that order is answered in it.
"""

from __future__ import annotations

import json
from typing import Any

TYPES = ("text", "json_object", "json_schema", "regex", "choice", "grammar")
SHAPE = (
    'use {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}, '
    '{"type": "regex", "pattern": "..."}, {"type": "choice", "choices": ["...", ...]}, '
    '{"type": "grammar", "ebnf": "..."} or {"type": "text"}'
)


class FormatError(ValueError):
    """A response_format that cannot be used: the message says what is wrong and how to fix it."""


def canonical(value: object) -> str | None:
    """The canonical JSON text of a format (a mapping, or its JSON text); None for `{"type": "text"}`.
    Raises `FormatError` naming what is wrong with its shape."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise FormatError(f"it is not JSON text ({exc}): {SHAPE}") from None
    if not isinstance(value, dict):
        raise FormatError(f"it is not an object: {SHAPE}")
    kind = value.get("type")
    if kind not in TYPES:
        raise FormatError(f"type {kind!r} is not one of {', '.join(TYPES)}: {SHAPE}")
    if kind == "text":
        return None
    return json.dumps({"type": kind, **_fields(kind, value)}, separators=(",", ":"))


def _fields(kind: str, value: dict[str, Any]) -> dict[str, Any]:
    if kind == "json_schema":
        inner = value.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else None
        if not isinstance(schema, dict | bool):
            raise FormatError('json_schema needs {"json_schema": {"name": ..., "schema": <a JSON schema object>}}')
        return {"json_schema": {"schema": schema}}
    if kind == "regex":
        if not isinstance(value.get("pattern"), str) or not value["pattern"]:
            raise FormatError('regex needs {"pattern": "<a regular expression>"}')
        return {"pattern": value["pattern"]}
    if kind == "choice":
        choices = value.get("choices")
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise FormatError('choice needs {"choices": [<one or more non-empty strings>]}')
        return {"choices": choices}
    if kind == "grammar":
        if not isinstance(value.get("ebnf"), str) or not value["ebnf"].strip():
            raise FormatError('grammar needs {"ebnf": "<a grammar in llguidance\'s Lark syntax, start: ...>"}')
        return {"ebnf": value["ebnf"]}
    return {}
