"""Ratios of two contenders timed side by side, round by round: what the bench's tables report.

Why per round, not a ratio of medians: a shared 2-core machine drifts by 10-20% over minutes, and the
passes of one round run back to back, so each round's ratio sees one machine; their median then drops
a round where a pause hit one side. Beside each median the tables print the rounds' lowest and highest
ratio: on a quiet 2-core machine one round of 16 prompts at batch 1 read Lookahead anywhere from 1.15x
to 1.77x, so a difference inside that range is not evidence.
"""

from __future__ import annotations

import statistics


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
