"""Jacobi's trajectory on a scripted target: which tokens each iteration commits and what it guesses next.

Exact verification hides a broken refinement (every output still equals greedy decoding), so this
pins the trajectory itself. Checked by hand: with the refinement removed in `JacobiProposer._iterate`
(`row.guess = row.guess[accepted + 1:]`, the old guess kept), both tests below fail.
"""

from __future__ import annotations

import pytest
import torch
from bigram_model import argmax_table, bigram_model

from strategies import registry
from strategies.base import GenerationParams, RowRequest
from strategies.options import StrategyOptions
from strategies.proposers.jacobi import JacobiProposer
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from strategies.runtime.target_states import TargetStates
from strategies.verification.proposer import ProposalContext

# The target's greedy choice depends only on the token before: 0 -> 4, then 1 -> 2 -> ... -> 7 -> 7.
SUCCESSOR = [4, 2, 3, 4, 5, 6, 7, 7]


def _jacobi_trajectory(prompts, mode, block_size, max_new_tokens):
    """(rows' tokens, per row: [(tokens committed, guess after)] per iteration, the proposer's stats)."""
    target = ModelRunner(bigram_model(argmax_table(SUCCESSOR)))
    options = StrategyOptions(name="jacobi", adaptive=False)
    options.jacobi.mode, options.jacobi.init, options.jacobi.block_size = mode, "pad", block_size
    strategy = registry.create(options, registry.Models(target))
    proposer = strategy.drafters["jacobi"].proposer
    trajectory = [[] for _ in prompts]
    original = proposer.emitted

    def emitted(tokens, states):
        drafted = [row.drafted for row in proposer.rows]
        original(tokens, states)
        for b, (n, row) in enumerate(zip(drafted, proposer.rows, strict=True)):
            if n:
                trajectory[b].append((tokens[b], list(row.guess)))

    proposer.emitted = emitted
    requests = [RowRequest(prompt=p, key=i) for i, p in enumerate(prompts)]
    params = GenerationParams(max_new_tokens, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    out = strategy.generate(requests, params)
    return [r.tokens for r in out.rows], trajectory, out.stats


def test_pgj_refines_every_guess_and_fast_forwards_where_the_refinement_is_right():
    """Blocks of 3 from pad guesses (token 0). Prompt [1]: the prefill commits 2; greedy goes on 3 4 5 6 7 7.

    Iteration 1 verifies [0 0 0] after 2: the target says 3, then 4 after each 0, so the next guess is
    [4 4 4]; iteration 2 finds 4 right after 3, commits 4 and the target's 5, and refines the rest to
    [5 5], topped up with a pad for the next block, and so on (the comments below). Without the
    refinement, pads stay pads and every iteration commits one token.
    """
    tokens, trajectory, stats = _jacobi_trajectory([[1]], "pgj", block_size=3, max_new_tokens=8)
    assert tokens == [[2, 3, 4, 5, 6, 7, 7, 7]]
    assert trajectory == [
        [
            ([3], [4, 4, 4]),  # nothing accepted; every slot after a 0 says 4
            ([4, 5], [5, 5, 0]),  # 4 accepted (fast-forward); the block is done, a pad starts the next
            ([6], [6, 6, 4]),  # 5 and 5 were wrong after 5; 4 after the pad
            ([7], [7, 7]),  # two tokens of room left: the draft was [6 6]
            ([7, 7], [0, 0]),  # the refined 7 accepted, then the target's 7; the next block's pads
        ]
    ]
    assert stats["jacobi_iterations"] == 5
    assert stats["jacobi_committed"] == 7
    assert stats["jacobi_fast_forwarded"] == 2


def test_pj_on_a_model_that_ignores_the_guess_converges_in_two_iterations():
    """A target that says 7 after everything but 1: from [1], greedy is 2 then 7s. PJ guesses the whole
    output at once; the first iteration fixes one token and refines every other slot to 7, which is the
    fixed point: the second commits the rest. Two iterations for 11 tokens, in a batch of two rows
    with different prompt lengths, each on its own trajectory."""
    successor = [7, 2, 7, 7, 7, 7, 7, 7]
    target = ModelRunner(bigram_model(argmax_table(successor)))
    options = StrategyOptions(name="jacobi", adaptive=False)
    options.jacobi.mode, options.jacobi.init = "pj", "pad"
    strategy = registry.create(options, registry.Models(target))
    requests = [RowRequest(prompt=[1], key=0), RowRequest(prompt=[3, 5, 0, 1], key=1)]
    params = GenerationParams(12, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    out = strategy.generate(requests, params)
    assert [r.tokens for r in out.rows] == [[2] + [7] * 11] * 2
    # Iteration 1: [2 | pad x 10] -> 7 at every slot, 1 committed; iteration 2: 10 accepted + the bonus.
    assert out.stats["jacobi_iterations"] == 2 * 2
    assert out.stats["jacobi_committed_per_iteration"] == 11 / 2


# The proposer alone, driven step by step with literal target choices: guesses, blocks, EOS cuts.


def _jacobi(mode, block_size, init, contexts, ignore_eos=False, eos=frozenset({9})):
    proposer = JacobiProposer(mode, block_size, init)
    params = GenerationParams(20, SamplingParams(), eos_token_ids=eos, ignore_eos=ignore_eos)
    proposer.start([list(c) for c in contexts], params, None)
    return proposer


def _propose(proposer, budgets):
    keys = torch.zeros(len(budgets), dtype=torch.long)
    context = ProposalContext(num_generated=[1] * len(budgets), budgets=budgets, max_nodes=64, keys=keys)
    return [d.tokens for d in proposer.propose(context)]


def _verified(choices):
    """The states of a verify forward whose target chose `choices[b][slot]` (one-hot logits [B, W, 10])."""
    logits = torch.zeros(len(choices), max(map(len, choices)), 10)
    for b, row in enumerate(choices):
        logits[b, torch.arange(len(row)), torch.tensor(row)] = 1.0
    return TargetStates(hidden=None, kept=[[0]] * len(choices), logits=logits)


def _state(proposer):
    return [(row.guess, row.stable) for row in proposer.rows]


def test_each_init_guesses_from_the_context():
    assert _state(_jacobi("pgj", 3, "pad", [[1, 2]], eos=frozenset({6, 4}))) == [([4, 4, 4], [False] * 3)]
    assert _jacobi("pgj", 5, "repeat", [[1, 2, 3]]).rows[0].guess == [1, 2, 3, 1, 2]
    assert _jacobi("pgj", 1, "repeat", [[5, 6, 7]]).rows[0].guess == [7]
    # The last 1-gram 5 was followed by 6 9: retrieval takes that, repeat the context's tail.
    assert _jacobi("pgj", 2, "retrieval", [[5, 6, 9, 5]]).rows[0].guess == [6, 9]
    assert _jacobi("pgj", 2, "repeat", [[5, 6, 9, 5]]).rows[0].guess == [9, 5]
    assert _jacobi("pgj", 3, "retrieval", [[5, 6, 5]]).rows[0].guess == [6, 5, 6]  # copied on through the loop
    # The longest n-gram matched is 3: its latest occurrence, not that of the 4-gram.
    assert _jacobi("pgj", 2, "retrieval", [[1, 2, 3, 4, 8, 2, 3, 4, 9, 1, 2, 3, 4]]).rows[0].guess == [9, 1]
    two = _jacobi("pj", 3, "pad", [[1], [2, 3]])
    assert two.stats()["jacobi_blocks"] == 2 and [row.guess for row in two.rows] == [[9] * 20] * 2


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_hgj_cuts_a_guess_after_an_eos_and_counts_stationary_tokens(ignore_eos):
    jacobi = _jacobi("hgj", 3, "pad", [[1]], ignore_eos=ignore_eos)  # pads are the EOS 9
    assert _propose(jacobi, [10]) == [[9, 9, 9]]
    # Slot 0 chose 2 (emitted); the next guess is the choices at slots 1-3, the middle one unchanged.
    jacobi.emitted([[2]], _verified([[2, 3, 9, 4]]))
    if ignore_eos:
        assert _state(jacobi) == [([3, 9, 4], [False, True, False])]
        return
    assert _state(jacobi) == [([3, 9], [False, True])]  # nothing after an EOS would be emitted
    assert _propose(jacobi, [10]) == [[3, 9]]
    jacobi.emitted([[3, 9, 5]], _verified([[3, 9, 5]]))  # both accepted; the 9 had held its value
    assert _state(jacobi) == [([9], [False])] and jacobi.stats()["jacobi_blocks"] == 2
    assert _propose(jacobi, [2]) == [[9]]  # room for the block's 2 tokens left: still drafts
    assert _propose(jacobi, [1]) == [[]]  # less room than that: decodes plainly
    assert _propose(jacobi, [10]) == [[9]]
    jacobi.emitted([[4]], _verified([[4, 7]]))
    stats = jacobi.stats()
    assert (stats["jacobi_iterations"], stats["jacobi_committed"], stats["jacobi_stationary"]) == (3, 5, 1)
    assert stats["jacobi_fast_forwarded"] == 2 and _state(jacobi) == [([7], [False])]
    assert (stats["jacobi_iterations_per_block"], stats["jacobi_committed_per_iteration"]) == (1.5, 1.667)


def test_a_new_block_tops_up_the_refined_guess_and_rows_without_a_draft_step_plainly():
    jacobi = _jacobi("pgj", 3, "pad", [[1], [2]])
    assert _propose(jacobi, [3, 0]) == [[9, 9, 9], []]
    # Row 0: 9 accepted, then 5; the rest refined to [9 0] (the 9 unchanged). Row 1 took a plain step.
    jacobi.emitted([[9, 5], [6]], _verified([[9, 5, 9, 0], [6, 0, 0, 0]]))
    assert _state(jacobi) == [([9, 0], [True, False]), ([9, 9], [False, False])]
    assert jacobi.stats()["jacobi_iterations"] == 1
    assert _propose(jacobi, [3, 3]) == [[9, 0], [9, 9]]
    # Row 0's block ends after one more token: its refined guess [0 6] is topped up with a pad; row 1
    # accepts its whole guess and starts a block of the 2 tokens its overshoot leaves.
    jacobi.emitted([[8], [9, 9, 1]], _verified([[8, 0, 6], [9, 9, 1]]))
    assert _state(jacobi) == [([0, 6, 9], [True, False, False]), ([9, 9], [False, False])]
    assert jacobi.stats()["jacobi_blocks"] == 4 and jacobi.stats()["jacobi_iterations"] == 3
    # Steps the verifier did not take (a plain step, or none at all) move the guess on by what was emitted.
    assert _propose(jacobi, [3, 3]) == [[0, 6, 9], [9, 9]]
    jacobi.emitted([[7], [3]], TargetStates(hidden=None, kept=[[0], [0]], logits=None))
    assert _state(jacobi) == [([6, 9], [False, False]), ([9], [False])]
    assert _propose(jacobi, [3, 3]) == [[6, 9], [9]]
    jacobi.emitted([[7], [3]], None)
    assert [row.guess for row in jacobi.rows] == [[9], [9, 9, 9]] and jacobi.stats()["jacobi_iterations"] == 3


def test_rows_of_different_draft_lengths_refine_only_their_own_slots():
    jacobi = _jacobi("pgj", 3, "pad", [[1], [2]])
    assert _propose(jacobi, [3, 1]) == [[9, 9, 9], [9]]
    # Row 1 drafted one token: its slots 2 and 3 are padding, their choices are no guess.
    jacobi.emitted([[5], [4]], _verified([[5, 9, 7, 8], [4, 3, 2, 1]]))
    assert _state(jacobi) == [([9, 7, 8], [True, False, False]), ([3, 9], [False, False])]


def test_a_fresh_proposer_reports_zeros_and_refuses_unknown_settings():
    assert set(JacobiProposer("pgj", 3, "pad").stats().values()) == {0}
    for mode, init in (("pgj", "noise"), ("gauss", "pad")):
        with pytest.raises(ValueError, match="mode must be one of"):
            JacobiProposer(mode, 3, init)


def test_iterations_per_block_are_rounded_to_three_digits():
    jacobi = _jacobi("pgj", 3, "pad", [[1], [2], [3]])  # three blocks, two of them iterated once
    assert _propose(jacobi, [3, 3, 0]) == [[9, 9, 9], [9, 9, 9], []]
    jacobi.emitted([[5], [5], [5]], _verified([[5, 0, 0, 0], [5, 0, 0, 0], [5, 0, 0, 0]]))
    assert jacobi.stats()["jacobi_iterations_per_block"] == 0.667
