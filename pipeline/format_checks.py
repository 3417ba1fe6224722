"""Checks of `input.format` and `output.format` against the keys they give meaning to, run with the
job's other checks (`pipeline/checks.py`) before anything is written."""

from __future__ import annotations

from pipeline.config import JobConfig
from workers.common.json_lines import INPUT_FORMATS
from workers.common.output_formats import OUTPUT_FORMATS

# Keys a Batch API request file has no use for: each request line gives its own id, prompt and settings.
_REQUEST_FILE_KEYS = ("messages_column", "id_column", "strategy_column", "keep_columns", "params_columns")


def format_problems(config: JobConfig) -> list[str]:
    """Every problem of the formats' keys, each naming its key and the fix."""
    i, o = config.input, config.output
    problems = []
    if i.format and i.format not in INPUT_FORMATS:
        problems.append(
            f"input.format must be one of {', '.join(INPUT_FORMATS)} (empty: inferred from the file names), "
            f"got {i.format!r}"
        )
    if o.format not in OUTPUT_FORMATS:
        problems.append(f"output.format must be one of {', '.join(OUTPUT_FORMATS)}, got {o.format!r}")
    if i.format == "openai_batch":
        problems.extend(
            f"input.{key} does not apply to input.format=openai_batch (each request line gives its custom_id, "
            f"its prompt or messages and its settings): remove input.{key}"
            for key in _REQUEST_FILE_KEYS
            if getattr(i, key)
        )
    if o.format == "openai_batch":
        asked = [key for key in ("logprobs", "top_logprobs", "token_ids") if getattr(o, key)]
        problems.extend(
            f"output.{key} is not written in output.format=openai_batch (Batch API responses carry no "
            f"per-token scores here): use output.format=parquet or jsonl, or unset output.{key}"
            for key in asked
        )
        if i.keep_columns:
            problems.append(
                "input.keep_columns: output.format=openai_batch writes Batch API response lines, which have no "
                "place for input columns; use output.format=jsonl or parquet, or no keep_columns"
            )
    return problems
