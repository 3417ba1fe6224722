"""Medusa's and blockwise decoding's proposer (`strategies/proposers/medusa.py`) and its choices
(`medusa_choices.py`) on literal heads' rankings; each test names the mutants it kills."""

from __future__ import annotations

import pytest
import torch

from strategies.proposers.medusa import HeadsProposer
from strategies.proposers.medusa_choices import chain_choices, check_choices
from strategies.runtime.target_states import TargetStates
from strategies.verification.proposer import ProposalContext

CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


class LiteralHeads:
    """Heads whose logits are a literal table [k, B, N]; they record the states and depth asked for."""

    draft_lm_head = None

    def __init__(self, logits: torch.Tensor, drafted_tokens: int) -> None:
        self.logits, self.drafted_tokens = logits, drafted_tokens
        self.asked: list[tuple[torch.Tensor, int]] = []

    def draft_logits(self, hidden: torch.Tensor, depth: int) -> torch.Tensor:
        self.asked.append((hidden, depth))
        return self.logits[:depth]

    def to_target(self, drafted: torch.Tensor) -> torch.Tensor:
        return drafted + 100  # target ids apart from draft indices


def _ranked_logits() -> torch.Tensor:
    """[3, 2, 2] logits of 3 heads for 2 rows over a draft vocabulary of 2 (the tree ranks 2 per head):
    row 0 prefers index 1 at heads 0 and 2, index 0 at head 1; row 1 the other way round."""
    row0 = [[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]
    row1 = [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]
    return torch.tensor([row0, row1], dtype=torch.float64).transpose(0, 1)


def _context(budgets: list[int], max_nodes: int, hidden: torch.Tensor, kept: list[list[int]]) -> ProposalContext:
    return ProposalContext(
        [1] * len(budgets), budgets, max_nodes, torch.zeros(len(budgets)), TargetStates(hidden, kept)
    )


def test_each_node_is_its_heads_token_of_its_paths_last_rank_below_its_parent():
    """Kills a tree drafted from the wrong head or rank (`ranked[len(p) - 1][row][p[-1]]` off by one, or
    the row's index another row's), a node's parent other than its path's prefix, the heads asked for
    fewer or more depths than the deepest path kept (`max` as `min`), `max_rank` other than one more
    than the highest rank (a `topk` over more tokens than the heads draft raises), and per-row budgets
    ignored (a row allowed depth 1 keeps only the depth-1 paths; 0 drafts nothing)."""
    heads = LiteralHeads(_ranked_logits(), drafted_tokens=2)
    proposer = HeadsProposer("medusa", heads, CHOICES)
    hidden = torch.arange(2 * 3 * 4, dtype=torch.float64).reshape(2, 3, 4)
    drafts = proposer.propose(_context([3, 2], 16, hidden, [[0, 1], [0, 1, 2]]))
    # Row 0: head 0 ranks (1, 0), head 1 (0, 1), head 2 (1, 0); row 1 the other way round.
    assert drafts[0].tokens == [101, 100, 100, 101, 100, 101]
    assert drafts[0].parents == [-1, -1, 0, 0, 1, 2]
    assert drafts[1].tokens == [100, 101, 101, 100, 101]
    assert drafts[1].parents == [-1, -1, 0, 0, 1]
    states, depth = heads.asked[-1]
    assert depth == 3
    assert torch.equal(states, torch.stack([hidden[0, 1], hidden[1, 2]]))  # each row's last kept state
    shallow = proposer.propose(_context([1, 0], 16, hidden, [[0, 1], [0, 1, 2]]))
    assert (shallow[0].tokens, shallow[0].parents, shallow[1].tokens) == ([101, 100], [-1, -1], [])
    assert heads.asked[-1][1] == 1
    budgeted = proposer.propose(_context([3, 3], 3, hidden, [[0, 1], [0, 1, 2]]))
    assert [d.parents for d in budgeted] == [[-1, -1, 0], [-1, -1, 0]]  # the first 3 choices
    assert heads.asked[-1][1] == 2


def test_a_tree_that_ranks_more_tokens_than_the_heads_draft_is_refused():
    """Kills the refusal `max_rank > drafted_tokens` as `>=` or never raised, and `max_rank` counted from
    the ranks other than as the highest plus one; the proposer not named as its method."""
    with pytest.raises(ValueError, match="medusa: its tree ranks 2 tokens of a head, the heads draft 1"):
        HeadsProposer("medusa", LiteralHeads(_ranked_logits(), drafted_tokens=1), CHOICES)
    assert HeadsProposer("medusa", LiteralHeads(_ranked_logits(), drafted_tokens=2), CHOICES).max_rank == 2
    blockwise = HeadsProposer("blockwise", LiteralHeads(_ranked_logits(), drafted_tokens=1), chain_choices(3))
    assert (blockwise.name, blockwise.max_rank) == ("blockwise", 1)


def test_choices_are_checked_for_every_fault_a_tree_can_have():
    """Kills `check_choices` missing a fault (an empty path, a negative rank, a rank at or beyond the
    vocabulary, a path deeper than the heads, a prefix missing below the root's child), flagging a path
    exactly as deep as the heads or a rank of vocab_size - 1, checking vocabulary or depth without the
    heads given, and `chain_choices` drafting other than one top-1 per depth."""
    assert check_choices([[0], []]) == "an empty path (the root is the pending token, never a choice)"
    assert check_choices([[0], [0, -1]]) == "path [0, -1] has a negative rank (0 is a head's top-1)"
    assert check_choices([[0], [3]], vocab_size=3) == "path [3] has a rank outside 0..2"
    assert check_choices([[2], [2, 2]], num_heads=2, vocab_size=3) is None
    assert check_choices([[0], [0, 0], [0, 0, 0]], num_heads=2) == "path [0, 0, 0] is deeper than the 2 heads"
    assert check_choices([[0], [0, 0], [0, 0, 0], [7]]) is None  # unchecked without the heads
    assert check_choices([[1], [1, 0], [1]]) == "path [1] is listed twice"
    assert check_choices([[0], [1, 0]]) == "path [1, 0] comes before its prefix [1]"
    assert check_choices([[0], [0, 1, 2]]) == "path [0, 1, 2] comes before its prefix [0, 1]"
    assert chain_choices(3) == [[0], [0, 0], [0, 0, 0]]
    assert chain_choices(0) == []
