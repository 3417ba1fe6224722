"""A unit's input rows made ready to decode: read from their shard, named, tokenized, given their
settings, and grouped by what a batch must share, in the order they join batches.

A row that cannot be decoded is not a failure of the unit: each step puts it in `errors` (input row ->
why) and leaves it out of the rows to decode, and it becomes an error row of the part.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq
from transformers import PreTrainedTokenizerBase

from strategies.constraints.formats import FormatError
from strategies.constraints.grammars import Grammar
from strategies.runtime.prefix_cache import BLOCK_TOKENS
from workers.common.contract import derived_row_id, row_ids_of_id_column
from workers.common.row_settings import RowSettings, row_settings
from workers.common.spec import UnitInputError, WorkerSpec, WorkUnit
from workers.common.storage import filesystem
from workers.json_input import ROW_ID, chat_rows, read_json_unit
from workers.prompt_texts import encode, unit_prompts
from workers.rows import as_text, too_long_message

# What a batch shares: its strategy's name and the settings that shape the loop (`RowSettings.batch_key`).
Group = tuple[str, tuple]


def read_unit(spec: WorkerSpec, unit: WorkUnit) -> pa.Table:
    """The unit's row groups, in the input columns the job reads (a JSON Lines unit: its lines, with each
    row's id and problem). An unreadable or changed file is a `UnitInputError`: no retry on another
    actor reads it better."""
    if unit.input_format != "parquet":
        return read_json_unit(unit, spec)
    wanted = [
        spec.input.messages_column or spec.input.prompt_column,
        *([spec.input.id_column] if spec.input.id_column else []),
        *([spec.input.strategy_column] if spec.input.strategy_column else []),
        *spec.input.params_columns.values(),
        *spec.input.keep_columns,
    ]
    try:
        fs, path = filesystem(unit.shard_url, spec.input.storage_options)
        with fs.open(path, "rb") as f:
            table = pq.ParquetFile(f).read_row_groups(list(unit.row_groups), columns=list(dict.fromkeys(wanted)))
    except Exception as exc:
        raise UnitInputError(
            f"cannot read row groups {list(unit.row_groups)} of {unit.shard_url}: {exc}; "
            "fix or replace the file and run the same command again to resume"
        ) from exc
    if table.num_rows != unit.num_rows:
        raise UnitInputError(
            f"{unit.shard_url}: row groups {list(unit.row_groups)} hold {table.num_rows} rows, the footer "
            f"said {unit.num_rows}; the file changed during the job: start a new job for the new input"
        )
    return table


def row_ids(spec: WorkerSpec, table: pa.Table, unit: WorkUnit) -> list[str]:
    """Each row's id: read with a JSON Lines unit's rows, else its `input.id_column`, else one derived from
    its place in its shard."""
    if ROW_ID in table.column_names:
        return table.column(ROW_ID).to_pylist()
    if spec.input.id_column:
        return row_ids_of_id_column(table.column(spec.input.id_column)).to_pylist()
    return [derived_row_id(unit.shard_name, unit.first_row + i) for i in range(table.num_rows)]


def tokenize(
    spec: WorkerSpec, tokenizer: PreTrainedTokenizerBase, max_context: int, table: pa.Table, errors: dict[int, str]
) -> tuple[dict[int, list[int]], dict[int, int]]:
    """Token ids of the rows to decode, and every tokenized row's prompt length, by row index: plain
    prompts, or chat messages rendered by the tokenizer's template. A bad prompt, or one too long
    for the model (`max_context` tokens), goes into `errors`."""
    chat = chat_rows(table, spec.input)
    prompts, problems = unit_prompts(tokenizer, table, spec.input, chat)
    for i, problem in enumerate(problems):
        if problem and i not in errors:
            errors[i] = problem
    decodable = [i for i in range(len(prompts)) if i not in errors]
    encoded = encode(tokenizer, {i: as_text(prompts[i]) for i in decodable}, chat)
    prompt_tokens: dict[int, int] = {}
    token_ids: dict[int, list[int]] = {}
    for i in decodable:
        ids = encoded[i]
        prompt_tokens[i] = len(ids)
        if len(ids) >= max_context:
            errors[i] = too_long_message(len(ids), max_context)
        else:
            token_ids[i] = ids
    return token_ids, prompt_tokens


def settings_by_row(
    spec: WorkerSpec,
    job_settings: RowSettings,
    table: pa.Table,
    ids: list[str],
    token_ids: dict[int, list[int]],
    errors: dict[int, str],
    vocab_size: int,
) -> dict[int, RowSettings]:
    """Each decodable row's settings: the job's, overridden by `input.params_columns`. A row with a
    value that cannot be used, at temperature 0 when it is to be sampled several times, or naming a
    token outside the model's `vocab_size` tokens (stop_token_ids, logit_bias), becomes an error row
    (in `errors`, out of `token_ids`)."""
    named, samples = spec.input.params_columns, spec.generation.n
    values = {setting: table.column(column).to_pylist() for setting, column in named.items()}
    settings = {}
    for i in list(token_ids):
        found = row_settings(job_settings, {k: v[i] for k, v in values.items()}, named, ids[i])
        if not isinstance(found, str) and samples > 1 and found.temperature == 0:
            column = named.get("temperature")
            found = (
                f"row {ids[i]}: generation.n={samples} samples at temperature 0 would be {samples} "
                "copies of one greedy completion: give the row a temperature > 0"
                + (f" in input column {column!r}" if column else "")
            )
        outside = [] if isinstance(found, str) else [t for t in found.token_ids() if t >= vocab_size]
        if outside:
            found = (
                f"row {ids[i]}: token ids {outside} of its stop_token_ids or logit_bias are outside the model's "
                f"vocabulary of {vocab_size} tokens"
            )
        if isinstance(found, str):
            errors[i] = found
            del token_ids[i]
        else:
            settings[i] = found
    return settings


def compile_formats(
    spec: WorkerSpec,
    grammars: Callable[[str], Grammar],
    settings: dict[int, RowSettings],
    ids: list[str],
    token_ids: dict[int, list[int]],
    errors: dict[int, str],
) -> dict[int, Grammar]:
    """Each constrained row's grammar (`grammars`: the actor's cache, by canonical format). A row whose
    format cannot compile becomes an error row (in `errors`, out of `token_ids` and `settings`); the job's
    own compiled when the actor started (`Generator`), so such a format is always a row's column's."""
    column = spec.input.params_columns.get("response_format")
    compiled = {}
    for i, found in list(settings.items()):
        if found.response_format is None:
            continue
        try:
            compiled[i] = grammars(found.response_format)
        except FormatError as exc:
            errors[i] = (
                f"row {ids[i]}: input column {column!r} (response_format) is {found.response_format}: {exc}; fix the "
                "format, or null for the job's generation.response_format"
            )
            del token_ids[i], settings[i]
    return compiled


def groups(
    spec: WorkerSpec,
    table: pa.Table,
    token_ids: dict[int, list[int]],
    settings: dict[int, RowSettings],
    errors: dict[int, str],
    refusal: Callable[[str, RowSettings], str | None],
) -> dict[Group, list[tuple[int, int]]]:
    """(row, sample index) pairs to decode, grouped by strategy (`input.strategy_column` where given,
    else the job's) and by the settings a batch shares (`RowSettings.batch_key`).

    A row whose strategy refuses it (`refusal(name, settings)`: why the strategy cannot decode a row
    at its settings, or None) becomes an error row.
    """
    column = spec.input.strategy_column
    wanted = table.column(column).to_pylist() if column else None
    found: dict[Group, list[tuple[int, int]]] = {}
    for i in list(token_ids):
        name = (wanted[i] if wanted else None) or spec.strategy.name
        problem = refusal(name, settings[i])
        if problem:
            errors[i] = f"{column}: {problem}" if wanted else problem
            del token_ids[i]
            continue
        found.setdefault((name, settings[i].batch_key()), []).extend((i, s) for s in range(spec.generation.n))
    return found


def batch_order(
    grouped: dict[Group, list[tuple[int, int]]], token_ids: dict[int, list[int]]
) -> list[tuple[Group, tuple[int, int]]]:
    """(group, (row, sample index)) in the order they join batches: group by group, rows of similar
    prompt length together (a batch opened on them pads little), rows that begin alike next to each
    other, a row's samples next to each other (they share its prefill, `batch.start_batch`).

    Rows whose prompts begin with the same cache block (`prefix_cache.BLOCK_TOKENS` tokens) sort
    together, by their tokens, at the place of the shortest of them: rows of one batch, or of batches
    one after the other, then share prefixes the prefix cache computes once. The parts keep the
    input's order whatever this one is."""
    return [(group, item) for group, rows in grouped.items() for item in sorted(rows, key=_by_prompt(rows, token_ids))]


def _by_prompt(rows: list[tuple[int, int]], token_ids: dict[int, list[int]]) -> Callable[[tuple[int, int]], tuple]:
    """The sort key of `batch_order` for one group's rows (stable: samples stay together)."""
    size = BLOCK_TOKENS
    distinct = {i for i, _ in rows if len(token_ids[i]) > size}  # a prompt with a block to share
    stems = Counter(tuple(token_ids[i][:size]) for i in distinct)
    at: dict[tuple[int, ...], int] = {}  # a stem that prompts share -> its shortest prompt's length
    for i in distinct:
        stem = tuple(token_ids[i][:size])
        if stems[stem] > 1:
            at[stem] = min(at.get(stem, len(token_ids[i])), len(token_ids[i]))

    def key(item: tuple[int, int]) -> tuple:
        tokens = token_ids[item[0]]
        stem = tuple(tokens[:size])
        return (at[stem], 1, stem, tuple(tokens)) if stem in at else (len(tokens), 0, (), ())

    return key
