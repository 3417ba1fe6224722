"""Per-row generation settings: optional input columns (`input.params_columns`) override the job's
`max_new_tokens`, `temperature`, `top_p`, `stop` and `seed` row by row.

A value that cannot be used is the row's problem, not the job's: `row_settings` returns a message
naming the row, the column and the fix, and the row becomes an error row. A null value means the
job's setting.

Rows with different settings share a batch where the decoding loop allows it: a row's seed folds
into its sampling key (`sampling.seeded_key`) and its stop strings are its own callback, so neither
splits a batch. Temperature, top-p and `max_new_tokens` shape the loop itself (which drafters may
run, how tokens are drawn, how far a row goes), so rows are batched by them (`RowSettings.batch_key`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

SETTINGS = ("max_new_tokens", "temperature", "top_p", "stop", "seed")
INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class RowSettings:
    max_new_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int

    def batch_key(self) -> tuple[int, float, float]:
        """What the rows of one batch share."""
        return self.max_new_tokens, self.temperature, self.top_p


def row_settings(
    job: RowSettings, values: dict[str, object], columns: dict[str, str], row_id: str
) -> RowSettings | str:
    """The row's settings: `values` maps a setting to the row's value in its column (`columns`: setting
    -> column name); None keeps the job's. A str when a value cannot be used: what, where and the fix."""
    chosen = {}
    for setting, value in values.items():
        if value is None:
            continue
        checked = _CHECKS[setting](value)
        if isinstance(checked, _Bad):
            return (
                f"row {row_id}: input column {columns[setting]!r} ({setting}) is {value!r}: {checked.fix}, "
                f"or null for the job's generation.{setting}"
            )
        chosen[setting] = checked
    return dataclasses.replace(job, **chosen)


@dataclass(frozen=True)
class _Bad:
    fix: str


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _max_new_tokens(value: object) -> int | _Bad:
    number = _number(value)
    if number is None or number != int(number) or number < 1:
        return _Bad("use a whole number of tokens >= 1")
    return int(number)


def _temperature(value: object) -> float | _Bad:
    number = _number(value)
    return _Bad("use a number >= 0 (0: greedy)") if number is None or number < 0 else number


def _top_p(value: object) -> float | _Bad:
    number = _number(value)
    return _Bad("use a number in (0, 1]") if number is None or not 0 < number <= 1 else number


def _stop(value: object) -> tuple[str, ...] | _Bad:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list | tuple) or not all(isinstance(s, str) for s in stops):
        return _Bad("use a list of strings (a list<string> column) or one string")
    return tuple(stops)


def _seed(value: object) -> int | _Bad:
    if isinstance(value, bool) or not isinstance(value, int) or not INT64[0] <= value <= INT64[1]:
        return _Bad("use a whole number that fits in 64 bits (an integer column)")
    return value


_CHECKS = {
    "max_new_tokens": _max_new_tokens,
    "temperature": _temperature,
    "top_p": _top_p,
    "stop": _stop,
    "seed": _seed,
}
