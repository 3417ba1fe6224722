"""Drafts sized by how their kind fared (`strategies/proposers/draft_sizing.py`) at their edges: a chain of
at least one that loses to plain steps, a step where no row found a draft, a kind's first probe; each test
names the mutants it kills."""

from __future__ import annotations

from strategies.proposers.draft_sizing import AcceptanceRecord, best_length


def test_a_chain_of_at_least_one_is_its_best_length_even_where_every_length_loses_to_plain_steps():
    """Kills `best_length` starting a chain's best rate at +1.0 (a plain step's) rather than below any
    length's: k = 1 gives 1.5 / 2.0 = 0.75 tokens a plain step, k = 2 1.9 / 2.1 = 0.90, both below 1, and
    k = 2 is the better."""
    assert best_length([0.5, 0.4], [2.0, 2.1], plain_cost=None) == 2


def test_a_step_where_no_row_found_a_draft_drafts_nothing_however_cheap_a_draft_token():
    """Kills `AcceptanceRecord.depth` taking the deepest draft found as 1 where none was (`default=0` as 1):
    a one-token step priced below a plain step would then be drafted with nothing to draft."""
    assert AcceptanceRecord().depth([], 1, [0.9]) == 0


def test_a_kind_never_refused_first_probes_after_probe_every_refusals():
    """Kills `AcceptanceRecord.depth` counting a kind never seen as refused once already (`get(kind, 0)` as
    1): with `probe_every` 2 a kind that does not pay is refused first, then probed every second step."""
    record = AcceptanceRecord(probe_every=2)
    for _ in range(20):
        record.record("weak", drafted=1, accepted=0)
    costs = [1.3, 1.4]
    assert [record.depth([("weak", 2)], 1, costs) for _ in range(4)] == [0, 1, 0, 1]
