"""JSON Lines input as both sides see it: which file names are JSON Lines, how a file's bytes become
rows, and how a JSON value becomes text. The driver scans files with these rules to plan units and
check ids; the actor reads a unit with the same rules, so both count the same rows.

A row is a line that is not blank (blank lines are skipped, wherever they are). Rows are indexed by
their 0-based line number in the file, blank lines counted, so a derived row id (`file.jsonl#6`)
points at line 7 of the file whatever else the file holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

INPUT_FORMATS = ("parquet", "jsonl", "openai_batch")
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
# Stream compressions fsspec infers from these suffixes; a compressed file is read whole, as one unit.
COMPRESSED_SUFFIXES = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz"}
READ_BLOCK = 8 * 1024 * 1024


def compression(name: str) -> str | None:
    """The stream compression of a file name (`gzip` for `.gz`, …), or None."""
    for suffix, kind in COMPRESSED_SUFFIXES.items():
        if name.endswith(suffix):
            return kind
    return None


def is_json_lines_name(name: str) -> bool:
    """`.jsonl`, `.ndjson` or `.json`, optionally followed by `.gz`, `.bz2` or `.xz`."""
    for suffix in COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    return name.endswith(JSON_SUFFIXES)


def iter_lines(f: IO[bytes], block: int = READ_BLOCK) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line without its newline) of every line of a binary stream, read in blocks."""
    offset, rest = 0, b""
    while chunk := f.read(block):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            yield offset, line
            offset += len(line) + 1
    if rest:
        yield offset, rest


def rows_of(data: bytes, first_line: int) -> list[tuple[int, bytes]]:
    """(line index, line) of the rows of `data`, whose first line is line `first_line` of its file."""
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    return [(first_line + k, line) for k, line in enumerate(lines) if not is_blank(line)]


def is_blank(line: bytes) -> bool:
    return not line.strip()


def parse_object(line: bytes) -> dict[str, Any] | str:
    """A line's JSON object, or why it is not one."""
    try:
        value = json.loads(line)
    except UnicodeDecodeError as exc:
        return f"not valid UTF-8 ({exc.reason} at byte {exc.start})"
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg} at character {exc.pos})"
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__}, not an object"
    return value


def json_text(value: object) -> str | None:
    """A JSON value as text: a string as it is, null as None, anything else as its JSON text. Ids and
    kept fields of JSON rows are stored so: one column type whatever the rows hold."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def where(url: str, line_index: int) -> str:
    """A row's place, as a person would look it up: the file and its 1-based line number."""
    return f"{url} line {line_index + 1}"
