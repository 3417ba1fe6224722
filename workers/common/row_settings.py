"""Per-row generation settings: optional input columns (`input.params_columns`) override the job's
`max_new_tokens`, `temperature`, `top_p`, `stop`, `seed`, sampling controls (`CONTROLS`) and
`response_format` row by row.

A value that cannot be used is the row's problem, not the job's: `row_settings` returns a message
naming the row, the column and the fix, and the row becomes an error row. A null value means the
job's setting.

Rows with different settings share a batch where the decoding loop allows it: a row's seed folds
into its sampling key (`sampling.seeded_key`) and its stop strings are its own callback, so neither
splits a batch, and neither do the sampling controls: each row's are applied to its own logits, from its
own history (`strategies.runtime.logit_controls`), so a batch of rows with different penalties costs what
one with shared penalties would; nor do response formats, each row's grammar masking its own logits
(`strategies.constraints`). Temperature, top-p and `max_new_tokens` shape the loop itself (which drafters may
run, how tokens are drawn, how far a row goes), so rows are batched by them (`RowSettings.batch_key`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from strategies.constraints.formats import FormatError, canonical

# The sampling controls: applied to a row's logits before its token is chosen.
CONTROLS = (
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "min_tokens",
    "stop_token_ids",
    "logit_bias",
)
# The generation keys that joined after the first: part of a job's identity only away from their defaults.
LATER_SETTINGS = (*CONTROLS, "response_format")
SETTINGS = ("max_new_tokens", "temperature", "top_p", "stop", "seed", *LATER_SETTINGS)
TEXT_FORMAT = '{"type": "text"}'  # a row's response_format that asks for no format, whatever the job's
INT64 = (-(1 << 63), (1 << 63) - 1)
PENALTY_BOUND = 2.0  # presence and frequency penalties lie in [-2, 2], as OpenAI's
BIAS_BOUND = 100.0  # a logit bias lies in [-100, 100], as OpenAI's


@dataclass(frozen=True)
class RowSettings:
    max_new_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), by token id
    response_format: str | None = None  # canonical JSON text (`strategies.constraints.formats`); None: none

    def token_ids(self) -> list[int]:
        """The token ids the controls name, for a check against the model's vocabulary."""
        return [*self.stop_token_ids, *(token for token, _ in self.logit_bias)]

    def batch_key(self) -> tuple[int, float, float]:
        """What the rows of one batch share."""
        return self.max_new_tokens, self.temperature, self.top_p


_NO_CONTROLS = RowSettings(1, 0.0, 1.0, (), 0)


def sets_controls(settings: Any) -> bool:
    """Whether `settings` (a row's, or the job's `generation` section) ask for any sampling control."""
    for control in CONTROLS:
        value, none = getattr(settings, control), getattr(_NO_CONTROLS, control)
        if (len(value) > 0) if isinstance(none, tuple) else value != none:
            return True
    return False


def job_row_settings(generation: Any) -> RowSettings:
    """The job's settings (`generation.*`, already within bounds: `pipeline.checks`), every row's default."""
    g = generation
    return RowSettings(
        g.max_new_tokens,
        g.temperature,
        g.top_p,
        tuple(g.stop),
        g.seed,
        g.presence_penalty,
        g.frequency_penalty,
        g.repetition_penalty,
        g.min_p,
        g.min_tokens,
        tuple(g.stop_token_ids),
        tuple(sorted((int(token), float(bias)) for token, bias in g.logit_bias.items())),
        None if g.response_format is None else canonical(g.response_format),
    )


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


def column_value(settings: RowSettings, setting: str) -> object:
    """A checked setting as a settings column of a JSON input's table holds it, for `row_settings` to
    read back: lists as lists, a logit bias as the JSON text of {token id: bias}."""
    value = getattr(settings, setting)
    if setting == "logit_bias":
        return json.dumps({str(token): bias for token, bias in value})
    if setting == "response_format":
        return TEXT_FORMAT if value is None else value
    return list(value) if isinstance(value, tuple) else value


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


def _penalty(value: object) -> float | _Bad:
    number = _number(value)
    bad = number is None or not -PENALTY_BOUND <= number <= PENALTY_BOUND
    return _Bad(f"use a number in [-{PENALTY_BOUND:g}, {PENALTY_BOUND:g}] (0: none)") if bad else number


def _repetition_penalty(value: object) -> float | _Bad:
    number = _number(value)
    return _Bad("use a number > 0 (1: none)") if number is None or number <= 0 else number


def _min_p(value: object) -> float | _Bad:
    number = _number(value)
    return _Bad("use a number in [0, 1] (0: none)") if number is None or not 0 <= number <= 1 else number


def _min_tokens(value: object) -> int | _Bad:
    number = _number(value)
    if number is None or number != int(number) or number < 0:
        return _Bad("use a whole number of tokens >= 0")
    return int(number)


def _token_id(value: object) -> int | None:
    """A token id: a whole number >= 0, or its decimal text (a JSON object's key)."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    number = _number(value)
    return int(number) if number is not None and number == int(number) and number >= 0 else None


def _stop_token_ids(value: object) -> tuple[int, ...] | _Bad:
    ids = [_token_id(v) for v in value] if isinstance(value, list | tuple) else [None]
    if None in ids:
        return _Bad("use a list of token ids, whole numbers >= 0 (a list<int64> column)")
    return tuple(ids)


def _logit_bias(value: object) -> tuple[tuple[int, float], ...] | _Bad:
    fix = _Bad(
        f"use token ids mapped to biases in [-{BIAS_BOUND:g}, {BIAS_BOUND:g}]: a map<int64, double> column or the "
        'JSON text of an object such as {"50256": -100}'
    )
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return fix
    pairs = value.items() if isinstance(value, dict) else value  # a map column reads as (key, value) pairs
    if not isinstance(pairs, list | tuple | type({}.items())):
        return fix
    biases = {}
    for pair in pairs:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            return fix
        token, bias = _token_id(pair[0]), _number(pair[1])
        if token is None or bias is None or not -BIAS_BOUND <= bias <= BIAS_BOUND:
            return fix
        biases[token] = bias
    return tuple(sorted(biases.items()))


def _response_format(value: object) -> str | _Bad | None:
    try:
        return canonical(value)
    except FormatError as exc:
        return _Bad(f"{exc} (the JSON text of a response_format object)")


_CHECKS = {
    "max_new_tokens": _max_new_tokens,
    "temperature": _temperature,
    "top_p": _top_p,
    "stop": _stop,
    "seed": _seed,
    "presence_penalty": _penalty,
    "frequency_penalty": _penalty,
    "repetition_penalty": _repetition_penalty,
    "min_p": _min_p,
    "min_tokens": _min_tokens,
    "stop_token_ids": _stop_token_ids,
    "logit_bias": _logit_bias,
    "response_format": _response_format,
}
