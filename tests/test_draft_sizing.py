"""Drafts sized by how their kind fared (`strategies/proposers/draft_sizing.py`), on literal counts and costs,
and prompt lookup's kinds of match and loop-following copies."""

from __future__ import annotations

import pytest
import torch

from strategies.proposers.draft_sizing import AcceptanceRecord, best_length, linear_step_costs
from strategies.proposers.prompt_lookup import NgramIndex, PromptLookupProposer
from strategies.verification.proposer import ProposalContext


def test_the_length_with_most_tokens_per_cost_wins_and_none_where_no_draft_beats_a_plain_step():
    """Tokens per plain step: no draft 1.0; k = 1: 1.9 / 1.3 = 1.46; k = 2: 2.7 / 1.4 = 1.93; k = 3:
    2.8 / 1.5 = 1.87, so k = 2. Accepted a fifth of the time, one token gains 1.2 / 1.3 = 0.92: none."""
    costs = linear_step_costs(1.3, 0.1, 3)
    assert costs == pytest.approx([1.3, 1.4, 1.5])
    assert best_length([0.9, 0.8, 0.1], costs) == 2
    assert best_length([0.2, 0.04, 0.008], costs) == 0
    assert best_length([0.2, 0.04, 0.008], costs, plain_cost=None) == 1  # a chain of at least one
    assert best_length([1.0, 1.0], [1.0, 1.0]) == 2  # free and always right: as long as allowed
    assert best_length([0.5, 0.5], [1.5, 2.0]) == 0  # a tie with plain steps: the shorter


def test_only_verified_positions_are_counted_and_an_unseen_position_starts_from_the_prior():
    record = AcceptanceRecord(prior_accepted=1.0, prior_tried=2.0)
    record.record("own", drafted=4, accepted=2)  # positions 1, 2 accepted, 3 rejected, 4 never verified
    assert (record.tried["own"], record.accepted["own"]) == ([1, 1, 1], [1, 1, 0])
    record.record("own", drafted=4, accepted=4)
    assert (record.tried["own"], record.accepted["own"]) == ([2, 2, 2, 1], [2, 2, 1, 1])
    # Conditional acceptance (hits + 1) / (tries + 2): 3/4, 3/4, 2/4, 2/3; survival is their running product.
    assert record.survival("own", 5) == pytest.approx([0.75, 0.5625, 0.28125, 0.1875, 0.09375])
    assert record.survival("prompt", 2) == pytest.approx([0.5, 0.25])  # never drafted: the prior


def test_a_kind_that_does_not_pay_is_refused_and_drafts_once_every_probe_every_refusals():
    record = AcceptanceRecord(probe_every=4)
    for _ in range(20):
        record.record("weak", drafted=1, accepted=0)
    costs = linear_step_costs(1.3, 0.1, 4)
    depths = [record.depth([("weak", 4)], 1, costs) for _ in range(8)]
    assert depths == [0, 0, 0, 1, 0, 0, 0, 1]  # its best chain when probing: one token, the cheapest
    for _ in range(20):
        record.record("strong", drafted=4, accepted=4)
    assert record.depth([("strong", 4)], 1, costs) == 4
    assert record.depth([("strong", 2)], 1, costs) == 2  # no deeper than what it found


def test_a_batch_drafts_as_deep_as_its_mean_tokens_pay_for_since_every_row_pays_the_width():
    """After 20 whole acceptances, "strong" keeps each next token with (20 + 1) / (20 + 2): P(a >= j)
    0.95, 0.91, 0.87, 0.83; "weak", rejected 20 times, 0.045 then halving. Costs 1.3 + 0.3 per token
    more. Alone, strong drafts 4 (4.57 tokens / 2.2 = 2.07 per plain step). In a batch of four beside
    three weak rows the mean is 0.27, 0.24, 0.23, 0.21: 1.27 / 1.3 = 0.98 at best, below plain steps."""
    record = AcceptanceRecord()
    for _ in range(20):
        record.record("strong", drafted=4, accepted=4)
        record.record("weak", drafted=1, accepted=0)
    costs = linear_step_costs(1.3, 0.3, 4)
    assert record.depth([("strong", 4)], 1, costs) == 4
    assert record.depth([("strong", 4), ("weak", 4), ("weak", 4), ("weak", 4)], 4, costs) == 0
    assert record.depth([("strong", 4), ("strong", 4)], 2, costs) == 4  # two strong rows of two: as alone
    assert record.depth([], 3, costs) == 0


def test_a_continuation_that_runs_into_the_suffix_copies_on_from_what_it_drafted():
    index = NgramIndex([9, 5, 6, 7, 5, 6], min_n=1, max_n=3)  # suffix [5, 6] last seen at 1: period 3
    assert index.match() == (2, 1)
    assert index.continuation(7) == [7, 5, 6, 7, 5, 6, 7]
    assert NgramIndex([4, 4], 1, 2).continuation(3) == [4, 4, 4]  # a one-token loop
    assert NgramIndex([1, 2, 3, 1, 2, 8, 9], 1, 3).continuation(5) == []  # no earlier 9


def test_prompt_lookup_sizes_drafts_by_their_kinds_and_learns_from_what_the_rows_emit():
    """Kinds are (in the row's own output, match length). Row 0's suffix [6] matches once, in its
    prompt: that kind was always rejected, and alone the row drafts nothing. Row 1 loops in its own
    output (4 5 4 5): a 2-token match there, always accepted, drafts the whole budget, copying on past
    the end of the row. Side by side, the batch's mean tokens pay for a 6-deep step, and row 0, which
    pays that width anyway, drafts as deep. What the rows then emit is counted for their kinds at the
    positions verified."""
    record = AcceptanceRecord()
    for _ in range(30):
        record.record((False, 1), drafted=2, accepted=0)
        record.record((True, 2), drafted=6, accepted=6)
    costs = linear_step_costs(1.3, 0.05, 6)
    alone = PromptLookupProposer(1, 2, record, costs)
    alone.start([[5, 6, 7, 8, 6]], None, None)
    context = ProposalContext(num_generated=[1], budgets=[6], max_nodes=6, keys=torch.zeros(1))
    assert [d.tokens for d in alone.propose(context)] == [[]]
    proposer = PromptLookupProposer(1, 2, record, costs)
    proposer.start([[5, 6, 7, 8, 6], [1, 2, 3, 4, 5, 4, 5]], None, None)
    context = ProposalContext(num_generated=[1, 4], budgets=[6, 6], max_nodes=6, keys=torch.zeros(2))
    assert [d.tokens for d in proposer.propose(context)] == [[7, 8, 6, 7, 8, 6], [4, 5, 4, 5, 4, 5]]
    proposer.emitted([[9], [4, 5, 4, 9]], None)  # row 0: rejected at once; row 1: three accepted, then 9
    assert (record.tried[(False, 1)], record.accepted[(False, 1)]) == ([31], [0])
    assert record.tried[(True, 2)][:5] == [31, 31, 31, 31, 30]
    assert record.accepted[(True, 2)][:5] == [31, 31, 31, 30, 30]
