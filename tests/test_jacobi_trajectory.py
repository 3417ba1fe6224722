"""Jacobi's trajectory on a scripted target: which tokens each iteration commits and what it guesses next.

Exact verification hides a broken refinement (every output still equals greedy decoding), so this
pins the trajectory itself. Checked by hand: with the refinement removed in `JacobiProposer._iterate`
(`row.guess = row.guess[accepted + 1:]`, the old guess kept), both tests below fail.
"""

from __future__ import annotations

from bigram_model import argmax_table, bigram_model

from strategies import registry
from strategies.base import GenerationParams, RowRequest
from strategies.options import StrategyOptions
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams

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
