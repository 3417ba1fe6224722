"""What a controller learns and hands on (`strategies/control/observation.py`) on literal records; each
test names the mutants it kills."""

from __future__ import annotations

from strategies.control.controller import AdaptiveController, ControllerSettings
from strategies.control.settings import Learned
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits, StepRecord

A, B = "a", "b"


def test_exploring_seconds_are_drained_rounded_to_the_microsecond():
    """Kills `drain_exploring` rounding any of its three sums to other than 6 decimals."""
    c = AdaptiveController(ControllerSettings())
    c.exploring_s, c.exploring_lost_s, c.decode_s = 0.12345678, 0.02345678, 0.52345678
    assert c.drain_exploring() == {"exploring_s": 0.123457, "exploring_lost_s": 0.023457, "decoding_s": 0.523457}


def test_what_a_controller_learned_holds_its_tree_sizes_forwards_and_host_times():
    """Kills `learned` leaving out the node budgets, the forward times or the host times (a round trip
    through `warm_start` loses a field on both sides alike)."""
    c = AdaptiveController(ControllerSettings())
    c.start_batch({A: DraftLimits(4, 8, trees=True)}, 1)
    c.observe(StepRecord(AUTOREGRESSIVE, 1, 0.01, [0], [0], forward_s=0.008))
    c.observe(StepRecord(A, 1, 0.02, [8], [3], width=5, forward_s=0.012))
    learned = c.learned()
    assert learned.nodes == {A: 8}
    assert learned.forward_time == {(1, 1): ([0.008], 1), (1, 5): ([1.5], 1)}
    assert list(learned.host_time) == [(A, 1, 5)]
    assert learned.host_time[(A, 1, 5)][0] == [0.8]  # (0.02 - 0.012) s over a 0.01 s plain step
    assert learned.host_time[(A, 1, 5)][1] == 1


def test_loaded_tree_budgets_count_as_measured_at_their_drafters_loaded_row_steps():
    """Kills `warm_start` dating a loaded tree budget's τ at other than its drafter's loaded row steps,
    or failing (or dating it at other than 0) for a drafter whose steps were not loaded."""
    c = AdaptiveController(ControllerSettings())
    c.warm_start(Learned(measured={A: (3, 100)}, tree_tau={(A, 8): (2.0, 1.5), (B, 4): (1.5, 0.5)}))
    assert c.tree_tau_at == {(A, 8): 100, (B, 4): 0}
