"""A unit's part and log as the actor stages them: the output columns, filled row by row from what
decoded, the part's Parquet bytes, and the throughput records logged beside it. The actor only
stages; the driver alone commits (docs/design.md, "Data flow of one job")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from strategies.base import FINISH_LENGTH, RowOutput
from strategies.control.controller import AdaptiveController
from workers.common import contract
from workers.common.contract import FINISH_ERROR, OUTPUT_SCHEMA, SCORE_COLUMNS
from workers.common.spec import WorkerSpec
from workers.common.storage import filesystem, write_bytes
from workers.engine import SegmentRecord
from workers.rows import repetition_rate


def score_columns(spec: WorkerSpec) -> list[str]:
    """The columns of `SCORE_COLUMNS` the job asked for."""
    asked = {
        "token_ids": spec.output.token_ids,
        "logprobs": spec.output.logprobs,
        "top_logprobs": spec.output.top_logprobs > 0,
    }
    return [name for name in SCORE_COLUMNS.names if asked[name]]


def output_schema(spec: WorkerSpec, table: pa.Table) -> pa.Schema:
    """The output columns of `table`'s rows under this job's settings (`contract.output_schema`)."""
    return contract.output_schema(score_columns(spec), [table.schema.field(name) for name in spec.input.keep_columns])


def empty_columns(
    spec: WorkerSpec, table: pa.Table, row_ids: list[str], errors: dict[int, str], prompt_tokens: dict[int, int]
) -> dict[str, list]:
    """The output columns of `table`'s rows before any decodes: `generation.n` rows per input row (input
    order, then sample index), each an error row until `fill_row` fills it, with what is known already
    (its id, why it is not decoded (`errors`), its prompt's length, the input columns it keeps)."""
    n, samples = table.num_rows, spec.generation.n

    def each(values: list) -> list:  # an input row's value on each of its samples
        return [v for v in values for _ in range(samples)]

    columns: dict[str, list] = {name: [None] * (n * samples) for name in OUTPUT_SCHEMA.names}
    columns["row_id"], columns["sample_index"] = each(row_ids), list(range(samples)) * n
    columns["finish_reason"] = [FINISH_ERROR] * (n * samples)
    columns["error"] = each([errors.get(i) for i in range(n)])
    columns["num_prompt_tokens"] = each([prompt_tokens.get(i) for i in range(n)])
    for name in score_columns(spec):
        columns[name] = [None] * (n * samples)
    for name in spec.input.keep_columns:
        columns[name] = each(table.column(name).to_pylist())
    return columns


def fill_row(columns: dict[str, list], o: int, row: RowOutput, strategy: str, completion: str) -> None:
    """Output row `o`'s columns from its decoded `row`, which `strategy` decoded unless it says."""
    columns["completion"][o] = completion
    columns["finish_reason"][o] = row.finish_reason
    columns["num_generated_tokens"][o] = len(row.tokens)
    columns["strategy"][o] = row.strategy or strategy
    for name, value in row.columns.items():
        columns[name][o] = value
    _fill_scores(columns, o, row)


def _fill_scores(columns: dict[str, list], i: int, row: RowOutput) -> None:
    """Row `i`'s token ids and log-probabilities, in those of `SCORE_COLUMNS` the job asked for."""
    if "token_ids" in columns:
        columns["token_ids"][i] = list(row.tokens)
    if "logprobs" in columns:
        columns["logprobs"][i] = [s.logprob for s in row.logprobs]
    if "top_logprobs" in columns:
        columns["top_logprobs"][i] = [
            [{"token_id": t, "logprob": v} for t, v in zip(s.top_ids, s.top_logprobs, strict=True)]
            for s in row.logprobs
        ]


def stage(url: str, data: bytes, storage_options: dict[str, Any]) -> None:
    write_bytes(*filesystem(url, storage_options), data)


def throughput_record(
    record: SegmentRecord,
    job_id: str,
    actor: str,
    device: str,
    controller: AdaptiveController | None,
    prefix_counts: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A throughput record of the actor's decoding (`engine.SegmentRecord`) for the job's `_logs/`, with
    the controller's switches and exploration, and the target's prefills through its prefix cache
    (`prefix_counts`: `PrefixCache.drain_counts`), since the previous record."""
    name, _ = record.group
    segment, rows = record.segment, record.finished
    generated = segment.generated_tokens
    return {
        "job_id": job_id,
        "units": record.units,
        "actor": actor,
        "device": device,
        "strategy": name,
        "batch_size": record.batch_size,
        "prompt_tokens": record.prompt_tokens,
        "generated_tokens": generated,
        "target_forwards": segment.target_forwards,
        "rows_finished": len(rows),
        "rows_at_length": sum(r.finish_reason == FINISH_LENGTH for r in rows),
        "repetition_rate": round(sum(repetition_rate(r.tokens) for r in rows) / len(rows), 4) if rows else None,
        "wall_s": round(record.wall_s, 6),
        "tokens_per_s": round(generated / record.wall_s, 3) if record.wall_s > 0 else None,
        "time": record.time,
        **segment.stats,
        "switches": controller.drain_events() if controller is not None else [],
        "exploring": controller.drain_exploring() if controller is not None else {},
        **({"prefix_cache": prefix_counts()} if prefix_counts is not None else {}),
    }
