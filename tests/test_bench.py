"""The benchmark's speed-up is a median of per-round ratios, robust to the machine's drift."""

from __future__ import annotations

import pytest

from jobs.bench import paired_speedup


def test_paired_speedup_follows_each_round_and_drops_an_outlier():
    # The machine slows down by half in rounds 3-4; the contender is 1.25x faster in every round.
    reference = [1.0, 1.0, 2.0, 2.0, 1.0]
    contender = [0.8, 0.8, 1.6, 1.6, 3.0]  # round 5: a pause hit the contender
    assert paired_speedup(reference, contender) == pytest.approx(1.25)
