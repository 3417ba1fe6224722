"""How a config value outside what its key allows is reported: one wording for every config (jobs,
strategies), each message naming the key, what it must be and the value given. It sits beside
`config_option` on the lowest floor, so strategies check their own options with it.
"""

from __future__ import annotations

from collections.abc import Sequence

# A numeric key's check: (key, value, whether the value is within bounds, what it must be).
Bound = tuple[str, object, bool, str]


def out_of_bounds(bounds: list[Bound]) -> list[str]:
    """For each bound not met, a message naming the key, what it must be and the value given (a NaN
    compares false, so it is out of every bound)."""
    return [f"{key} must be {need}, got {value!r}" for key, value, ok, need in bounds if not ok]


def one_of(key: str, value: str, allowed: Sequence[str]) -> list[str]:
    """A message if `value` is none of the names `allowed` for `key`."""
    return [] if value in allowed else [f"{key}={value!r}: use one of {', '.join(allowed)}"]
