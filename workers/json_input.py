"""An actor's read of a JSON Lines unit (`input.format`: `jsonl`, `openai_batch`) as the table the
generator decodes, the same table a Parquet unit gives, plus two columns of its own: each row's id
(`ROW_ID`) and, for a row that cannot be decoded, why (`ROW_ERROR`).

JSON rows are not typed as a Parquet column is, so every value is checked here, row by row, and a
value that does not fit is that row's error, never the unit's: a line that is not a JSON object,
a prompt that is not text, a per-row setting out of its bounds (`row_settings`), a request field
accelgen cannot honour (`openai_batch`). The columns then have one type whatever the rows held.
"""

from __future__ import annotations

import dataclasses
import posixpath
from typing import Any

import pyarrow as pa

from workers.common.contract import derived_row_id
from workers.common.json_lines import compression, json_text, parse_object, rows_of, where
from workers.common.openai_batch import PARAMS_COLUMNS, parse_request
from workers.common.output_formats import ResponseContext
from workers.common.row_settings import RowSettings, column_value, row_settings
from workers.common.sections import InputConfig
from workers.common.spec import UnitInputError, WorkerSpec, WorkUnit
from workers.common.storage import filesystem

ROW_ID = "accelgen:row_id"
ROW_ERROR = "accelgen:error"
# A request file's prompt columns: a row has one or the other (the request's url says which).
REQUEST_PROMPT, REQUEST_MESSAGES = "body.prompt", "body.messages"
_SETTING_TYPES = {
    "max_new_tokens": pa.int64(),
    "temperature": pa.float64(),
    "top_p": pa.float64(),
    "stop": pa.list_(pa.string()),
    "seed": pa.int64(),
    "presence_penalty": pa.float64(),
    "frequency_penalty": pa.float64(),
    "repetition_penalty": pa.float64(),
    "min_p": pa.float64(),
    "min_tokens": pa.int64(),
    "stop_token_ids": pa.list_(pa.int64()),
    "logit_bias": pa.string(),  # JSON text of {token id: bias}
    "response_format": pa.string(),  # JSON text of the format
}


def as_read(spec: WorkerSpec) -> WorkerSpec:
    """The job as the generator reads its units: a request file's input keys name the columns
    `read_json_unit` builds (`request_file_input`); other inputs' keys stay as they are."""
    if spec.input.format != "openai_batch":
        return spec
    return dataclasses.replace(spec, input=request_file_input(spec.input))


def request_file_input(config: InputConfig) -> InputConfig:
    """The input keys as the generator reads a request file's table: its prompt columns and the body
    fields' settings columns (`openai_batch.PARAMS_COLUMNS`); the rest does not apply to requests."""
    return dataclasses.replace(
        config,
        prompt_column=REQUEST_PROMPT,
        messages_column=None,
        id_column=None,
        strategy_column=None,
        keep_columns=[],
        params_columns=dict(PARAMS_COLUMNS),
    )


def read_json_unit(unit: WorkUnit, spec: WorkerSpec) -> pa.Table:
    """The unit's rows as a table: `spec.input`'s columns (a request file: `request_file_input`'s),
    `ROW_ID` and `ROW_ERROR`."""
    rows = _unit_rows(unit, spec.input.storage_options)
    g = spec.generation
    job = RowSettings(g.max_new_tokens, g.temperature, g.top_p, tuple(g.stop), g.seed)
    if unit.input_format == "openai_batch":
        return _request_table(unit, rows, g.n)
    return _jsonl_table(unit, rows, spec.input, job)


def row_problems(table: pa.Table) -> dict[int, str]:
    """The rows of a JSON Lines unit that cannot be decoded, and why (none for a Parquet unit)."""
    if ROW_ERROR not in table.column_names:
        return {}
    return {i: error for i, error in enumerate(table.column(ROW_ERROR).to_pylist()) if error is not None}


def chat_rows(table: pa.Table, config: InputConfig) -> list[bool]:
    """Whether each row's prompt is chat messages (rendered through the chat template) or plain text."""
    if config.messages_column:
        return [True] * table.num_rows
    if REQUEST_MESSAGES in table.column_names:
        return [m is not None for m in table.column(REQUEST_MESSAGES).to_pylist()]
    return [False] * table.num_rows


def response_context(spec: WorkerSpec, table: pa.Table) -> ResponseContext | None:
    """What a Batch API part says beyond its rows (`output.format=openai_batch`), else None."""
    if spec.output.format != "openai_batch":
        return None
    model = posixpath.basename(spec.model.target.rstrip("/"))
    return ResponseContext(chat_rows(table, spec.input), model, spec.job_id)


def _unit_rows(unit: WorkUnit, storage_options: dict[str, Any]) -> list[tuple[int, bytes]]:
    what = f"bytes {unit.byte_range[0]}-{unit.byte_range[1]}" if unit.byte_range else "the whole file"
    try:
        fs, path = filesystem(unit.shard_url, storage_options)
        if unit.byte_range:
            data = fs.cat_file(path, start=unit.byte_range[0], end=unit.byte_range[1])
        else:
            with fs.open(path, "rb", compression=compression(path)) as f:
                data = f.read()
    except Exception as exc:
        raise UnitInputError(
            f"cannot read {what} of {unit.shard_url}: {exc}; fix or replace the file and run the same command "
            "again to resume"
        ) from exc
    rows = rows_of(data, unit.first_row)
    if len(rows) != unit.num_rows:
        raise UnitInputError(
            f"{unit.shard_url}: {what} hold {len(rows)} rows, the job's plan said {unit.num_rows}; the file "
            "changed during the job: start a new job for the new input"
        )
    return rows


def _jsonl_table(unit: WorkUnit, rows: list[tuple[int, bytes]], config: InputConfig, job: RowSettings) -> pa.Table:
    prompt_field = config.messages_column or config.prompt_column
    text_fields = [*([config.strategy_column] if config.strategy_column else []), *config.keep_columns]
    columns: dict[str, list] = {ROW_ID: [], ROW_ERROR: [], prompt_field: [], **{f: [] for f in text_fields}}
    settings: dict[str, list] = {s: [] for s in config.params_columns}
    for line_index, line in rows:
        parsed = parse_object(line)
        obj = parsed if isinstance(parsed, dict) else {}
        row_id = json_text(obj.get(config.id_column)) if config.id_column and obj else None
        row_id = row_id if row_id is not None else derived_row_id(unit.shard_name, line_index)
        problem = f"{where(unit.shard_url, line_index)}: {parsed}" if isinstance(parsed, str) else None
        prompt = obj.get(prompt_field)
        if config.messages_column:
            prompt = json_text(prompt)
        elif prompt is not None and not isinstance(prompt, str):
            problem = problem or f"field {prompt_field!r} must be text, got {type(prompt).__name__}"
            prompt = None
        values = {s: obj.get(field) for s, field in config.params_columns.items()}
        checked = row_settings(job, values, dict(config.params_columns), row_id)
        problem = problem or (checked if isinstance(checked, str) else None)
        columns[ROW_ID].append(row_id)
        columns[ROW_ERROR].append(problem)
        columns[prompt_field].append(prompt)
        for f in text_fields:
            columns[f].append(json_text(obj.get(f)))
        for s, value in values.items():
            settings[s].append(column_value(checked, s) if value is not None and not isinstance(checked, str) else None)
    table = pa.table({name: pa.array(values, pa.string()) for name, values in columns.items()})
    for s, values in settings.items():
        table = table.append_column(config.params_columns[s], pa.array(values, _SETTING_TYPES[s]))
    return table


def _request_table(unit: WorkUnit, rows: list[tuple[int, bytes]], samples: int) -> pa.Table:
    columns: dict[str, list] = {ROW_ID: [], ROW_ERROR: [], REQUEST_PROMPT: [], REQUEST_MESSAGES: []}
    settings: dict[str, list] = {s: [] for s in PARAMS_COLUMNS}
    for line_index, line in rows:
        place = where(unit.shard_url, line_index)
        parsed = parse_object(line)
        request = parse_request(parsed, samples) if isinstance(parsed, dict) else None
        problem = parsed if request is None else request.problem
        custom_id = request.custom_id if request is not None else None
        columns[ROW_ID].append(custom_id if custom_id is not None else derived_row_id(unit.shard_name, line_index))
        columns[ROW_ERROR].append(f"{place}: {problem}" if problem else None)
        columns[REQUEST_PROMPT].append(request.prompt if request is not None else None)
        columns[REQUEST_MESSAGES].append(request.messages if request is not None else None)
        for s in PARAMS_COLUMNS:
            settings[s].append(request.settings.get(s) if request is not None else None)
    table = pa.table({name: pa.array(values, pa.string()) for name, values in columns.items()})
    for s, values in settings.items():
        table = table.append_column(PARAMS_COLUMNS[s], pa.array(values, _SETTING_TYPES[s]))
    return table
