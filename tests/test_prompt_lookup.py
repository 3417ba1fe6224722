"""Prompt lookup's n-gram index, its drafts and what it learns from them (`strategies/proposers/prompt_lookup.py`,
`draft_sizing.py`), on literal token lists: each test names the mutants (docs/testing.md, "Mutation testing")
it kills."""

from __future__ import annotations

import pytest
import torch

from strategies.proposers.draft_sizing import AcceptanceRecord, best_length, linear_step_costs
from strategies.proposers.prompt_lookup import NgramIndex, PromptLookupProposer
from strategies.verification.proposer import ProposalContext


def _context(budgets: list[int], generated: list[int], step_costs: list[float] | None = None) -> ProposalContext:
    rows = len(budgets)
    return ProposalContext(generated, budgets, max(budgets), torch.zeros(rows), step_costs=step_costs)


def test_the_latest_occurrence_of_the_longest_suffix_is_copied_within_min_and_max_n():
    """Kills a lookup from the wrong position or with the wrong n-gram length: `extend` indexing n-grams
    from min_n ± 1 or to max_n ± 1, at `end ± n`, keeping the first occurrence instead of the latest;
    `match` trying n shortest first, from max_n ± 1 or down to min_n ± 1; `copy_after` starting at
    `start + n ± 1`; `extend` indexing n-grams shorter than min_n, which no lookup reads."""
    index = NgramIndex([1, 2, 3, 7, 5, 2, 3, 8, 1, 2, 3], min_n=1, max_n=3)
    assert index.match() == (3, 0)  # [1, 2, 3] before 7; [2, 3] alone was last seen before 8
    assert index.continuation(3) == [7, 5, 2]
    capped = NgramIndex([1, 2, 3, 7, 5, 2, 3, 8, 1, 2, 3], min_n=1, max_n=2)
    assert capped.match() == (2, 5)
    assert capped.continuation(2) == [8, 1]
    latest = NgramIndex([5, 1, 5, 2, 5], min_n=1, max_n=1)
    assert latest.match() == (1, 2)  # the 5 before 2, not the first one before 1
    assert latest.continuation(2) == [2, 5]
    assert NgramIndex([1, 2, 9, 3, 2], min_n=2, max_n=3).continuation(2) == []  # [2] alone is too short
    assert NgramIndex([1, 2, 9, 3, 2], min_n=1, max_n=3).continuation(2) == [9, 3]
    assert NgramIndex([4, 6, 4, 6], min_n=2, max_n=2).continuation(1) == [4]  # a 2-gram is indexed at its end
    assert NgramIndex([4, 6, 1, 4, 6], min_n=3, max_n=3).continuation(1) == []
    assert index.continuation(0) == []
    assert {len(ngram) for ngram in NgramIndex([1, 2, 3, 4, 5], min_n=2, max_n=3).latest} == {2, 3}


def test_an_index_extended_token_by_token_equals_one_built_at_once():
    """Kills `extend` indexing an n-gram at the wrong position as tokens arrive one at a time (the
    emitted tokens of each step), and `extend` forgetting the tokens themselves."""
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 1, 4, 1]
    grown = NgramIndex(tokens[:3], min_n=1, max_n=3)
    for token in tokens[3:]:
        grown.extend([token])
    whole = NgramIndex(tokens, min_n=1, max_n=3)
    assert grown.tokens == tokens
    assert grown.latest == whole.latest
    assert grown.match() == whole.match() == (3, 1)
    assert grown.continuation(4) == [5, 9, 2, 6]


def test_a_draft_is_as_long_as_the_rows_budget_and_none_where_the_budget_is_zero():
    """Kills `propose` without sizing ignoring a row's budget (drafting past it, or for a row whose
    budget is 0) and its chain's parents being other than the chain's."""
    proposer = PromptLookupProposer(1, 3)
    proposer.start([[1, 2, 3, 1, 2], [7, 8, 7, 8], [4, 5, 6]], None, None)
    drafts = proposer.propose(_context([2, 0, 3], [1, 1, 1]))
    assert [d.tokens for d in drafts] == [[3, 1], [], []]
    assert drafts[0].parents == [-1, 0]
    proposer.emitted([[3, 9], [7], [6]], None)  # the index follows what each row emitted
    assert [d.tokens for d in proposer.propose(_context([3, 3, 2], [3, 2, 2]))] == [[], [8, 7, 8], [6, 6]]


def test_a_matchs_kind_says_whether_it_lies_in_the_rows_own_output():
    """Kills the kind's test `start >= len(tokens) - generated` as `>`, `<`, or with `+`: a match that
    starts at the first generated token is in the row's own output, one a token earlier is in its
    prompt; and the kind's n other than the match's length."""
    record = AcceptanceRecord(prior_accepted=2.0, prior_tried=2.0)  # every kind pays: drafts stay whole
    costs = [1.0, 1.0, 1.0]
    proposer = PromptLookupProposer(1, 2, record, costs)
    # Row 0: suffix [6, 7] seen at 3 (context of 7, 3 generated: output starts at 4): in the prompt.
    # Row 1: suffix [6, 7] seen at 3 (context of 7, 4 generated: output starts at 3): its own output.
    proposer.start([[1, 2, 3, 6, 7, 6, 7], [1, 2, 3, 6, 7, 6, 7]], None, None)
    proposer.propose(_context([2, 2], [3, 4]))
    assert [row.pending for row in proposer.rows] == [((False, 2), [6, 7]), ((True, 2), [6, 7])]


def test_what_a_row_emits_counts_its_drafts_tokens_up_to_the_first_rejection():
    """Kills `emitted` counting accepted tokens past the first mismatch, counting the target's own last
    token as accepted (`len(tokens) - 1` as `len(tokens)`), starting from 1, or not clearing the row's
    pending draft (its verdict counted twice)."""
    record = AcceptanceRecord(prior_accepted=2.0, prior_tried=2.0)
    proposer = PromptLookupProposer(1, 1, record, [1.0, 1.0, 1.0])
    proposer.start([[4, 5, 6, 7, 4], [4, 5, 6, 7, 4], [4, 5, 6, 7, 4], [4, 5, 6, 7, 4]], None, None)
    drafts = proposer.propose(_context([3, 3, 3, 3], [1, 1, 1, 1]))
    assert [d.tokens for d in drafts] == [[5, 6, 7]] * 4
    # Row 0: 2 accepted, then the target's 9. Row 1: a mismatch first, then tokens that match again.
    # Row 2: all 3 accepted and the target's token. Row 3: ended after the draft's first token.
    proposer.emitted([[5, 6, 9], [9, 6, 7, 1], [5, 6, 7, 8], [5]], None)
    kind = (False, 1)
    assert record.tried[kind] == [4, 2, 2]  # position 1 by every row, 2 and 3 by rows 0 and 2
    assert record.accepted[kind] == [2, 2, 1]
    assert all(row.pending is None for row in proposer.rows)
    proposer.emitted([[1], [1], [1], [1]], None)  # a step without drafts counts nothing
    assert record.tried[kind] == [4, 2, 2]


def test_the_controllers_step_costs_size_the_drafts_before_the_proposers_own():
    """Kills `context.step_costs or self.step_costs` taken the other way round or as `and`: the
    controller's cost model, where it has one, says what a depth costs."""
    record = AcceptanceRecord()
    for _ in range(30):
        record.record((False, 1), drafted=3, accepted=3)
    dear = linear_step_costs(3.0, 3.0, 3)  # no draft pays
    cheap = [1.0, 1.0, 1.0]
    proposer = PromptLookupProposer(1, 1, record, dear)
    proposer.start([[4, 5, 6, 7, 4]], None, None)
    assert [d.tokens for d in proposer.propose(_context([3], [1], step_costs=cheap))] == [[5, 6, 7]]
    proposer.emitted([[5, 6, 7, 8]], None)
    proposer.start([[4, 5, 6, 7, 4]], None, None)
    assert [d.tokens for d in proposer.propose(_context([3], [1]))] == [[]]


def test_a_kind_is_probed_after_exactly_probe_every_refusals_by_default():
    """Kills `AcceptanceRecord`'s default `probe_every` other than 16, its priors other than 1 in 2,
    and `depth`'s probe test `refused + 1 >= probe_every` as `>` or without the `+ 1`."""
    record = AcceptanceRecord()
    assert record.survival("new", 2) == [0.5, 0.25]
    for _ in range(40):
        record.record("weak", drafted=1, accepted=0)
    costs = linear_step_costs(1.3, 0.1, 2)
    depths = [record.depth([("weak", 2)], 1, costs) for _ in range(32)]
    assert [i for i, depth in enumerate(depths) if depth] == [15, 31]


def test_the_best_length_counts_the_pending_token_and_the_shortest_of_equals():
    """Kills `best_length` starting its tokens at 0 or 2 instead of 1 (the pending token), taking the
    longer of equal rates (`>` as `>=`), and its plain-step rate other than 1 / plain_cost."""
    assert best_length([1.0], [2.0]) == 0  # 2 tokens for 2 plain steps: as good as plain steps
    assert best_length([1.0], [1.9]) == 1
    assert best_length([0.5, 0.0], [1.0, 1.0]) == 1  # a 2nd token never accepted: 1.5 tokens either way
    assert best_length([0.5], [1.4], plain_cost=2.0) == 1  # 1.5 / 1.4 beats half a token per plain step
    assert best_length([0.5], [3.1], plain_cost=2.0) == 0
    assert best_length([], [], plain_cost=None) == 1


def test_a_row_that_drafts_nothing_awaits_no_verdict():
    """Kills `propose` leaving a pending draft on a row that found none (`if tokens` made always true):
    its next emitted tokens would be counted as a verdict on an empty draft of no kind."""
    record = AcceptanceRecord()
    proposer = PromptLookupProposer(1, 2, record, [1.0, 1.0])
    proposer.start([[1, 2, 3]], None, None)
    assert [d.tokens for d in proposer.propose(_context([2], [1]))] == [[]]
    assert proposer.rows[0].pending is None
    proposer.emitted([[4]], None)
    assert record.tried == {}


def test_a_batch_depth_counts_each_drafts_survival_only_as_far_as_its_room():
    """Kills `AcceptanceRecord.depth` adding a draft's survival past the tokens it found (`[: min(room,
    depth)]`), dividing by other than the batch's rows, sizing deeper than the costs given, and
    `survival` past the positions counted other than the prior. Prior survival 1/2, 1/4, 1/8: one row
    with room 1 and one with 3 in a batch of 2 average 0.5, 0.125, 0.0625 (costs 1, 1.1, 1.2: one token
    is best); counted whole they would average 0.5, 0.25, 0.125 (two tokens best)."""
    record = AcceptanceRecord()
    assert record.depth([("k", 1), ("k", 3)], 2, [1.0, 1.1, 1.2]) == 1
    assert record.depth([("k", 3), ("k", 3)], 2, [1.0, 1.1, 1.2]) == 2
    assert record.depth([("k", 3)], 4, [1.2, 1.3, 1.4]) == 0  # a quarter of the batch: 1.125 / 1.2 < 1
    assert record.depth([("k", 9)], 1, [0.5, 0.5]) == 2  # no deeper than the costs say
    record.record("k", drafted=1, accepted=1)
    record.record("k", drafted=1, accepted=1)
    assert record.survival("k", 3) == pytest.approx([0.75, 0.375, 0.1875])
