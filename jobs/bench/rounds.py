"""Contenders timed side by side, round by round (`in_turns`), and the ratios the bench's tables report.

Why per round, not a ratio of medians: a shared 2-core machine drifts by 10-20% over minutes, and the
passes of one round run back to back, so each round's ratio sees one machine; their median then drops
a round where a pause hit one side. Beside each median the tables print the rounds' lowest and highest
ratio: on a quiet 2-core machine one round of 16 prompts at batch 1 read Lookahead anywhere from 1.15x
to 1.77x, so a difference inside that range is not evidence.
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
P = TypeVar("P")


def in_turns(
    starters: Mapping[K, Callable[[], Callable[[int], P]]], batches: int, repeats: int
) -> dict[K, list[list[P]]]:
    """Per contender, per round, what each of its `batches` batches gave (`P`, its time among it): a new
    pass of each contender per round (`starters[name]()`, which decodes batch `i` when called with it),
    the contenders taking turns batch by batch in an order that reverses after every batch. A contender
    is not always first or last, and the machine's drift over a round weighs on all alike: a 2-core
    machine's speed moved by a tenth between whole passes seconds apart, which at batch 1 decided a
    pass-against-pass ratio more than the strategies did."""
    parts: dict[K, list[list[P]]] = {name: [] for name in starters}
    order = list(starters)
    for _ in range(repeats):
        passes = {name: start() for name, start in starters.items()}
        # A round starts with no garbage of earlier ones: a Lookahead pass leaves a large trie whose
        # collection would otherwise land in whichever contender's batch came next.
        gc.collect()
        done: dict[K, list[P]] = {name: [] for name in starters}
        for i in range(batches):
            for name in order:
                done[name].append(passes[name](i))
            order.reverse()
        for name in starters:
            parts[name].append(done[name])
    return parts


def per_round(numerators: list[float], denominators: list[float]) -> list[float]:
    """Each round's numerator over its denominator (a round whose denominator is 0 left out): a
    reference's time over a contender's, or a contender's rate over a reference's."""
    return [n / d for n, d in zip(numerators, denominators, strict=True) if d > 0]


def paired(numerators: list[float], denominators: list[float]) -> float:
    """The median over rounds of `per_round`."""
    return statistics.median(per_round(numerators, denominators))


def spread(ratios: list[float]) -> list[float]:
    """The lowest and highest of per-round ratios, as the reports keep them."""
    return [round(min(ratios), 3), round(max(ratios), 3)]


def format_range(bounds: list[float] | None) -> str:
    return "-" if bounds is None else f"{bounds[0]:.2f}-{bounds[1]:.2f}"
