"""`option`: a config dataclass field with its help text, for every section of every config (jobs,
strategies, benches, training). It sits on the lowest floor so that `strategies/` declares its options
with it too; `accelgen ... --help` reads the help from the field's metadata.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any


def option(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with its help text; mutable defaults go through `default_factory`."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kwargs)
    return field(default=default, metadata={"help": help}, **kwargs)
