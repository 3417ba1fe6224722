"""Strategy names -> constructors. An unknown name fails loudly with the list of known ones."""

from __future__ import annotations

from collections.abc import Callable

from strategies.autoregressive import AutoregressiveStrategy
from strategies.base import Strategy
from strategies.runner import ModelRunner

_REGISTRY: dict[str, Callable[[ModelRunner], Strategy]] = {
    AutoregressiveStrategy.name: AutoregressiveStrategy,
}


def available() -> list[str]:
    return sorted(_REGISTRY)


def create(name: str, runner: ModelRunner) -> Strategy:
    if name not in _REGISTRY:
        raise KeyError(f"unknown strategy {name!r}; available: {', '.join(available())}")
    return _REGISTRY[name](runner)
