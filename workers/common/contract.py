"""The output contract: the columns of every output row, and the names that tie input rows, work units
and output parts together (docs/design.md, "Output contract").

Each of these is built and parsed here alone: the driver plans and commits with them, the generator
writes rows with them, `accelgen verify` checks a finished job against them, and the tests ask them
instead of spelling a format out. It sits in `workers/common/` because the actors write the rows and the driver
reads them, and imports only go down (jobs → pipeline → workers → workers/common → strategies).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from strategies import registry

FINISH_ERROR = "error"  # a row that was not decoded; `error` says why (the others: strategies.base)

# The Python types strategies declare their output columns' values with, as Arrow types.
_ARROW_TYPES = {float: pa.float64(), int: pa.int64(), list[int]: pa.list_(pa.int64())}


def _strategy_field(name: str, kind: object) -> pa.Field:
    if kind not in _ARROW_TYPES:
        raise TypeError(
            f"output column {name!r} is declared with type {kind!r}, which the output contract cannot store: "
            f"declare one of {', '.join(map(repr, _ARROW_TYPES))} (workers/common/contract.py, _ARROW_TYPES)"
        )
    return pa.field(name, _ARROW_TYPES[kind])


# Filled for every row, whatever decoded it.
COMMON_SCHEMA = pa.schema(
    [
        ("row_id", pa.string()),
        ("sample_index", pa.int64()),  # 0 .. generation.n - 1
        ("completion", pa.string()),
        ("finish_reason", pa.string()),
        ("error", pa.string()),
        ("num_prompt_tokens", pa.int64()),
        ("num_generated_tokens", pa.int64()),
        ("strategy", pa.string()),
    ]
)
# Then the columns strategies declare (`output_columns` of the strategy class, e.g. calm's
# `mean_exit_layer`, mask_predict's `iterations` and `block_lengths`): null on other strategies' rows.
STRATEGY_COLUMNS = pa.schema([_strategy_field(name, kind) for name, kind in registry.output_columns().items()])
OUTPUT_SCHEMA = pa.schema([*COMMON_SCHEMA, *STRATEGY_COLUMNS])
# Columns added on request (output.token_ids, output.logprobs, output.top_logprobs): one entry per
# generated token, the same tokens `num_generated_tokens` counts.
SCORE_COLUMNS = pa.schema(
    [
        ("token_ids", pa.list_(pa.int64())),
        ("logprobs", pa.list_(pa.float64())),
        ("top_logprobs", pa.list_(pa.list_(pa.struct([("token_id", pa.int64()), ("logprob", pa.float64())])))),
    ]
)

_UNIT_DIGITS = 5  # zero-padded, so that names sort as the input listing does


def output_schema(scores: list[str], keep_fields: list[pa.Field]) -> pa.Schema:
    """The schema of a part: the contract's columns, the `SCORE_COLUMNS` asked for, then the input's
    `keep_columns` as they are."""
    return pa.schema(list(OUTPUT_SCHEMA) + [SCORE_COLUMNS.field(name) for name in scores] + keep_fields)


def derived_row_id(shard_name: str, index: int) -> str:
    """The row id of row `index` of a shard (its path relative to `input.url`) when the input has no id column."""
    return f"{shard_name}#{index}"


def row_ids_of_id_column(ids: pa.ChunkedArray) -> pa.ChunkedArray:
    """An id column's values as row ids: Python's `str` of each value (a string stays as it is)."""
    if pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type):
        return pc.cast(ids, pa.string())
    return pa.chunked_array([pa.array([str(v) for v in ids.to_pylist()], pa.string())])


def unit_id(shard_index: int, first_row_group: int) -> str:
    """A work unit's id, from its shard's position in the sorted input listing and its first row group:
    the same input always plans the same ids, which makes retries and resume idempotent."""
    return f"{shard_index:0{_UNIT_DIGITS}d}-{first_row_group:0{_UNIT_DIGITS}d}"


def parse_unit_id(unit: str) -> tuple[int, int]:
    """(shard index, first row group) of a unit id that `unit_id` built."""
    shard, _, group = unit.partition("-")
    if not (shard.isdigit() and group.isdigit()):
        raise ValueError(f"{unit!r} is not a unit id (shard-rowgroup, e.g. {unit_id(0, 0)})")
    return int(shard), int(group)


def part_name(unit: str, suffix: str = ".parquet") -> str:
    """The file name of a unit's committed part in the output folder (`suffix`: its format's)."""
    return f"part-{unit}{suffix}"
