"""JSON Lines inputs (`input.format`: `jsonl`, `openai_batch`): which format an input is, and the
driver's scan that plans and checks it before anything is written.

Parquet says its row counts in its footers; a JSON Lines file says nothing until it is read, so the
driver reads each file once, as a stream: it counts rows (non-blank lines, `workers/common/json_lines.py`),
cuts a plain file into units of about `input.rows_per_unit` rows at line starts (byte ranges an actor
fetches with one ranged read), and, where rows carry ids (`input.id_column`, a request's
`custom_id`), reads them to refuse null and duplicate ids as the Parquet path does. A compressed file
cannot be entered in the middle: it is one unit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pyarrow as pa

from pipeline.errors import JobError
from pipeline.shards import PLANNING_THREADS, Listing, Shard, parallel_map, plan_units
from workers.common.contract import OUTPUT_SCHEMA, SCORE_COLUMNS, derived_row_id, unit_id
from workers.common.json_lines import (
    compression,
    is_blank,
    is_json_lines_name,
    iter_lines,
    json_text,
    parse_object,
    where,
)
from workers.common.sections import InputConfig
from workers.common.spec import WorkUnit

_NO_FIELDS = ()


def resolve_format(configured: str | None, listing: Listing, url: str) -> str:
    """`input.format` as given, or inferred from the file names: JSON Lines names
    (`json_lines.is_json_lines_name`) make `jsonl`, any other names `parquet` (as every input was
    before JSON Lines). `openai_batch` is never inferred: a request file is a JSONL file too."""
    if configured:
        return configured
    json_files = [p for p in listing.paths if is_json_lines_name(p)]
    if not json_files:
        return "parquet"
    others = [p for p in listing.paths if not is_json_lines_name(p)]
    if not others:
        return "jsonl"
    raise JobError(
        f"input.url {url} holds JSON Lines files ({listing.name(json_files[0])}) and others "
        f"({listing.name(others[0])}): input.format is inferred only from file names that agree; set "
        "input.format (parquet, jsonl or openai_batch), or point input.url at files of one kind"
    )


@dataclass(frozen=True)
class TextUnit:
    """A run of a JSON Lines file's rows: bytes [start, end) (end None: to the file's end), starting
    at line `first_line`."""

    start: int
    end: int | None
    first_line: int
    rows: int


@dataclass(frozen=True)
class TextShard(Shard):
    input_format: str = "jsonl"
    units: tuple[TextUnit, ...] = ()
    row_ids: tuple[str, ...] | None = None  # when read: every row's id, in file order
    null_id_at: str | None = None  # where the first row without an id is
    fields: tuple[str, ...] = _NO_FIELDS  # the keys of the file's first JSON object


def scan_text_shards(
    listing: Listing,
    input_format: str,
    rows_per_unit: int,
    id_field: str | None,
    want_ids: bool,
    threads: int = PLANNING_THREADS,
) -> list[TextShard]:
    """Every listed file scanned (`_scan`), `threads` at a time. `want_ids`: read every row's id."""
    ids = want_ids or bool(id_field) or input_format == "openai_batch"
    return parallel_map(lambda p: _scan(listing, p, input_format, rows_per_unit, id_field, ids), listing.paths, threads)


def _scan(
    listing: Listing, path: str, input_format: str, rows_per_unit: int, id_field: str | None, want_ids: bool
) -> TextShard:
    url, name, kind = listing.prefix + path, listing.name(path), compression(path)
    units: list[TextUnit] = []
    ids: list[str] | None = [] if want_ids else None
    fields: tuple[str, ...] | None = None
    null_id_at = None
    start = first_line = rows = end = 0
    try:
        with listing.fs.open(path, "rb", compression=kind) as f:
            for line_index, (offset, line) in enumerate(iter_lines(f)):
                end = offset + len(line) + 1
                if is_blank(line):
                    continue
                if rows == rows_per_unit and kind is None:
                    units.append(TextUnit(start, offset, first_line, rows))
                    rows = 0
                if rows == 0:  # a compressed file is read from its start, as one unit
                    start, first_line = (offset, line_index) if kind is None else (0, 0)
                rows += 1
                if fields is None or ids is not None:
                    parsed = parse_object(line)
                    if fields is None and isinstance(parsed, dict):
                        fields = tuple(parsed)
                    if ids is not None:
                        row_id = _row_id(parsed, input_format, id_field, name, line_index)
                        if row_id is None and null_id_at is None:
                            null_id_at = where(url, line_index)
                        ids.append(row_id or derived_row_id(name, line_index))
    except Exception as exc:
        raise JobError(f"cannot read {url}: {exc}; fix or remove the file") from None
    if rows:
        units.append(TextUnit(start, end if kind is None else None, first_line, rows))
    return TextShard(
        url=url,
        name=name,
        size=int(listing.details[path].get("size") or 0),
        stamp=listing.stamp(path),
        num_rows=sum(u.rows for u in units),
        row_group_rows=(),
        schema=pa.schema([]),
        input_format=input_format,
        units=tuple(units),
        row_ids=tuple(ids) if ids is not None else None,
        null_id_at=null_id_at,
        fields=fields or _NO_FIELDS,
    )


def _row_id(parsed: dict | str, input_format: str, id_field: str | None, name: str, line_index: int) -> str | None:
    """A row's id as the actor will derive it; None: a JSON object without its id (a job error). A line
    that is not an object has no id to read: its error row takes its derived id."""
    if not isinstance(parsed, dict):
        return derived_row_id(name, line_index)
    if input_format == "openai_batch":
        custom_id = json_text(parsed.get("custom_id"))
        return custom_id if custom_id is not None else derived_row_id(name, line_index)
    if id_field:
        return json_text(parsed.get(id_field))
    return derived_row_id(name, line_index)


def check_text_input(shards: list[TextShard], config: InputConfig) -> None:
    """Fail the job unless the configured fields are in the first JSON object of the input and the ids
    are present and unique (`input.id_column`, or the requests' `custom_id`)."""
    if config.format != "openai_batch":
        _check_fields(shards, config)
    for shard in shards:
        if shard.null_id_at:
            raise JobError(
                f"input.id_column {config.id_column!r} is null or missing at {shard.null_id_at}: give every row an id"
            )
    key = "input.id_column" if config.id_column else "custom_id"
    if not (config.id_column or config.format == "openai_batch"):
        return
    counts = Counter(row_id for shard in shards for row_id in shard.row_ids or ())
    duplicated = [row_id for row_id, n in counts.items() if n > 1]
    if duplicated:
        raise JobError(
            f"{key}: {len(duplicated)} ids appear on more than one line, e.g. {duplicated[:3]}: ids must be "
            "unique across the input"
        )


def _check_fields(shards: list[TextShard], config: InputConfig) -> None:
    first = next((s for s in shards if s.fields), None)
    if first is None:
        return  # no row is a JSON object: each is an error row saying so
    wanted = {"input.keep_columns": list(config.keep_columns)}
    if config.messages_column:
        wanted["input.messages_column"] = [config.messages_column]
    else:
        wanted["input.prompt_column"] = [config.prompt_column]
    if config.id_column:
        wanted["input.id_column"] = [config.id_column]
    for setting, column in config.params_columns.items():
        wanted[f"input.params_columns.{setting}"] = [column]
    for key, names in wanted.items():
        for name in names:
            if name not in first.fields:
                raise JobError(
                    f"{key}: field {name!r} is not in the first JSON object of {first.url} (fields: "
                    f"{', '.join(first.fields)}); name a field the rows have"
                )
    clashing = sorted(set(config.keep_columns) & {*OUTPUT_SCHEMA.names, *SCORE_COLUMNS.names})
    if clashing:
        raise JobError(f"input.keep_columns {clashing} clash with output columns; rename them in the input")


def plan_input_units(shards: list[Shard], rows_per_unit: int) -> list[WorkUnit]:
    """The job's units: Parquet shards by row groups (`shards.plan_units`), JSON Lines files by the
    runs of lines their scan cut. Unit ids: the file's place in the listing and the run's."""
    if not shards or not isinstance(shards[0], TextShard):
        return plan_units(shards, rows_per_unit)
    return [
        WorkUnit(
            unit_id=unit_id(index, k),
            shard_url=shard.url,
            shard_name=shard.name,
            row_groups=(),
            first_row=unit.first_line,
            num_rows=unit.rows,
            input_format=shard.input_format,
            byte_range=None if unit.end is None else (unit.start, unit.end),
        )
        for index, shard in enumerate(shards)
        if isinstance(shard, TextShard)
        for k, unit in enumerate(shard.units)
    ]


def text_row_ids(shards: list[TextShard]) -> pa.ChunkedArray:
    """Every row id of a scanned JSON Lines input (scanned with `want_ids`), in listing order."""
    return pa.chunked_array([pa.array(list(s.row_ids or ()), pa.string()) for s in shards], type=pa.string())


def formats_identity(output_format: str, shards: list[Shard]) -> dict[str, dict[str, str]]:
    """The formats as part of a job's identity: nothing for Parquet in and out, so that the ids of
    jobs from before other formats existed stay what they were."""
    input_format = shards[0].input_format if shards and isinstance(shards[0], TextShard) else "parquet"
    if input_format == output_format == "parquet":
        return {}
    return {"formats": {"input": input_format, "output": output_format}}
