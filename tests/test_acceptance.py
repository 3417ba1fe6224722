"""Acceptance rules and draft trees on literal inputs, and the distribution speculative sampling keeps."""

from __future__ import annotations

import math

import pytest
import torch

from strategies.runtime.sampling import STREAM_ACCEPT, STREAM_TARGET, SamplingParams, greedy_tokens, keyed_uniform
from strategies.verification import acceptance
from strategies.verification.acceptance import (
    Slots,
    accept,
    decide_rejection_sampling,
    rejection_chains,
    target_choices,
)
from strategies.verification.drafts import (
    Draft,
    children_by_slot,
    draft_problem,
    is_chain,
    tree_attention,
    tree_depths,
)
from strategies.verification.rules import ExactMatch, RejectionSampling, Relaxed, Typical
from strategies.verification.tree_walks import DraftTable, relaxed_walk, typical_walk, walk, walk_rows


def test_tree_helpers_on_a_literal_tree():
    # pending -> a(0) -> c(2);  pending -> b(1) -> d(3) -> e(4)
    parents = [-1, -1, 0, 1, 3]
    assert tree_depths(parents) == [0, 1, 1, 2, 2, 3]
    allowed = tree_attention(parents, width=7).int().tolist()
    assert allowed[5] == [1, 0, 1, 0, 1, 1, 0]  # e sees pending, b, d and itself
    assert allowed[3] == [1, 1, 0, 1, 0, 0, 0]  # c sees pending, a and itself
    assert allowed[6] == [0, 0, 0, 0, 0, 0, 1]  # padding sees only itself
    draft = Draft(tokens=[10, 11, 12, 13, 14], parents=parents)
    assert children_by_slot(draft)[0] == {10: 1, 11: 2}
    assert draft_problem(draft, vocab_size=100, max_nodes=5, max_depth=3) is None
    assert "deeper" in draft_problem(draft, vocab_size=100, max_nodes=5, max_depth=2)
    assert "vocabulary" in draft_problem(Draft([100], [-1]), 100, 5, 5)
    assert "at most" in draft_problem(Draft.chain([1, 2, 3]), 100, 2, 5)
    assert "parent" in draft_problem(Draft([1, 2], [-1, 1]), 100, 5, 5)


def test_draft_problems_at_each_bound_and_the_chain_shapes():
    assert Draft.chain([4, 5, 6]).parents == [-1, 0, 1] and Draft.chain([4, 5]).tokens == [4, 5]
    assert Draft.empty().tokens == [] and Draft.empty().parents == [] and len(Draft.empty()) == 0
    probs = torch.full((2, 4), 0.25)
    assert Draft.chain([4, 5], probs).probs is probs and Draft.chain([4]).probs is None
    with pytest.raises(ValueError):  # a malformed draft is never walked in part
        children_by_slot(Draft([1, 2], [-1]))
    assert draft_problem(Draft.empty(), vocab_size=10, max_nodes=0, max_depth=0) is None
    chain = Draft.chain([0, 9, 3])  # vocabulary ids at both ends, as many nodes and as deep as allowed
    assert draft_problem(chain, vocab_size=10, max_nodes=3, max_depth=3) is None
    assert draft_problem(chain, 10, 2, 3) == "3 tokens, at most 2 allowed"
    assert draft_problem(chain, 10, 3, 2) == "a branch deeper than the 2 tokens the row can still emit"
    assert draft_problem(Draft([1, 2], [-1]), 10, 5, 5) == "tokens and parents differ in length"
    assert draft_problem(Draft([-1], [-1]), 10, 5, 5) == "token id outside the vocabulary"
    assert draft_problem(Draft([10], [-1]), 10, 5, 5) == "token id outside the vocabulary"
    assert draft_problem(Draft([1], [-2]), 10, 5, 5) == "a parent index does not precede its node"
    assert draft_problem(Draft([1, 2], [-1, 1]), 10, 5, 5) == "a parent index does not precede its node"
    assert draft_problem(Draft([1, 2], [-1, 0], torch.zeros(2, 10)), 10, 5, 5) is None
    wrong = Draft([1, 2], [-1, 0], torch.zeros(2, 9))
    assert draft_problem(wrong, 10, 5, 5) == "probs of shape (2, 9), expected (2, 10)"
    assert is_chain(chain) and is_chain(Draft.empty()) and not is_chain(Draft([1, 2], [-1, -1]))
    # Two children of one node with the same token: the first keeps the slot.
    assert children_by_slot(Draft([7, 7, 8], [-1, -1, 0])) == [{7: 1}, {8: 3}, {}, {}]
    assert tree_attention([], width=2).tolist() == [[True, False], [False, True]]


def test_walk_follows_the_targets_choices():
    draft = Draft(tokens=[10, 11, 12, 13], parents=[-1, -1, 1, 2])  # two branches below the pending token
    # Target picks 11 at the root, then 12, then something off the tree.
    verdict = walk(draft, chosen=[11, 99, 12, 13, 42])
    assert verdict.accepted_slots == [2, 3, 4] and verdict.tokens == [11, 12, 13, 42]
    assert walk(draft, chosen=[7, 0, 0, 0, 0]).tokens == [7]  # nothing accepted: the correction only
    chain = Draft.chain([5, 6, 7])
    assert walk(chain, chosen=[5, 6, 7, 8]).tokens == [5, 6, 7, 8]  # all accepted, plus the bonus


# One batch of literal drafts and the target's choices at each slot (-1: padding, never read):
# a tree whose second branch is taken to its leaf, a chain accepted whole, a chain rejected at its
# first node, an empty draft, a tree with a repeated token under one parent (the first child wins)
# and a deeper tree accepted part way. Widths are ragged: 5, 4, 3, 1, 4 and 7 slots.
WALK_BATCH = [
    (Draft(tokens=[10, 11, 12, 13], parents=[-1, -1, 1, 2]), [11, 99, 12, 13, 42, -1, -1]),
    (Draft.chain([5, 6, 7]), [5, 6, 7, 8, -1, -1, -1]),
    (Draft.chain([5, 6]), [4, 6, 7, -1, -1, -1, -1]),
    (Draft.empty(), [3, -1, -1, -1, -1, -1, -1]),
    (Draft(tokens=[9, 9, 2], parents=[-1, -1, 1]), [9, 1, 2, 3, -1, -1, -1]),
    (Draft(tokens=[1, 2, 3, 4, 5, 6], parents=[-1, 0, 1, 1, 3, -1]), [1, 2, 4, 8, 8, 8, 8]),
]


@pytest.mark.parametrize("stop_early", [True, False])
def test_walk_rows_equals_walk_on_literal_trees_and_batches(stop_early):
    drafts, chosen = [d for d, _ in WALK_BATCH], torch.tensor([c for _, c in WALK_BATCH])  # [B, 7]
    reference = [walk(d, c[: len(d) + 1]) for d, c in zip(drafts, chosen.tolist(), strict=True)]
    assert [v.tokens for v in reference] == [[11, 12, 13, 42], [5, 6, 7, 8], [4], [3], [9, 1], [1, 2, 4, 8]]
    cpu = torch.device("cpu")
    for rows in ([0], [1], [3], [5, 2, 4]):  # batches of one and more, in any order
        batch, table = [drafts[r] for r in rows], chosen[rows]
        found = walk_rows(batch, DraftTable.of(batch, cpu), lambda at, t=table: t[torch.arange(len(t)), at], stop_early)
        assert found == [reference[r] for r in rows]
    asked = []

    def choose(at: torch.Tensor) -> torch.Tensor:
        asked.append(at.tolist())
        return chosen[torch.arange(len(drafts)), at]

    assert walk_rows(drafts, DraftTable.of(drafts, cpu), choose, stop_early) == reference
    # The target is asked at the slots the walk stands on, a level at a time: stopping early, no
    # level past the one where the last row stops (the 4th of this depth-4 batch).
    assert asked[:2] == [[0] * 6, [2, 1, 0, 0, 1, 1]]
    assert len(asked) == (4 if stop_early else 5)


@pytest.mark.parametrize("copies", [1, 2])  # 42 slots: every slot's argmax at once; 84: a level at a time
def test_exact_match_walks_the_targets_argmax_over_few_slots_and_many(copies, monkeypatch):
    drafts = [d for d, _ in WALK_BATCH] * copies
    chosen = torch.tensor([c for _, c in WALK_BATCH] * copies).clamp(min=0)  # [B, 7]
    logits = torch.nn.functional.one_hot(chosen, 100).double()  # [B, 7, 100]: the argmax is `chosen`
    logits[:, :, 99] = logits[:, :, 0]  # a tie at every slot where 0 is chosen: the first maximum wins
    by_level = []
    monkeypatch.setattr(acceptance, "walk_rows", lambda *a, **k: by_level.append(1) or walk_rows(*a, **k))
    verdicts = accept(ExactMatch(), logits, drafts, None, SamplingParams())
    assert verdicts == [walk(d, c[: len(d) + 1]) for d, c in zip(drafts, chosen.tolist(), strict=True)]
    assert bool(by_level) == (chosen.numel() > acceptance.HOST_SLOTS_REDUCED_AT_ONCE)


def test_greedy_tokens_are_the_argmax_ties_and_nans_included():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [3.0, 3.0, 3.0, 3.0], [0.0, float("nan"), 5.0, float("nan")]])
    assert greedy_tokens(logits).tolist() == logits.argmax(dim=-1).tolist() == [1, 0, 1]
    assert greedy_tokens(logits[None]).shape == (1, 3)


def test_relaxed_walk_accepts_near_ties_only_within_beta_and_tolerance():
    chain = Draft.chain([1, 2])
    logits = torch.tensor([[5.0, 4.5, 0.0, 0.0], [0.0, 0.0, 3.0, 3.2], [9.0, 0.0, 0.0, 0.0]])
    assert relaxed_walk(chain, logits, top_beta=1, tolerance=0.0).tokens == [0]  # exact greedy: reject 1
    assert relaxed_walk(Draft.chain([0]), logits, top_beta=1, tolerance=0.0).tokens == [0, 3]  # the top itself
    assert relaxed_walk(chain, logits, top_beta=2, tolerance=1.0).tokens == [1, 2, 0]
    assert relaxed_walk(chain, logits, top_beta=2, tolerance=0.1).tokens == [0]  # gap 0.5 > 0.1
    # β may exceed the slots of a short draft (a chain of 1: 2 slots); it is capped by the vocabulary alone.
    third = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    assert relaxed_walk(Draft.chain([2]), third, top_beta=3, tolerance=math.inf).tokens == [2, 3]
    assert relaxed_walk(Draft.chain([3]), third, top_beta=9, tolerance=math.inf).tokens == [3, 3]


def test_rejection_chains_on_literal_numbers():
    """Three rows of one forward: a chain of 1 accepted, the same chain rejected, an empty draft."""
    p = torch.tensor([[0.5, 0.5, 0.0], [0.1, 0.2, 0.7]], dtype=torch.float64).expand(3, 2, 3)  # [B, N + 1, V]
    q = torch.tensor([[[0.25, 0.75, 0.0]]], dtype=torch.float64).expand(3, 1, 3)  # [B, N, V]
    tokens, lengths = torch.tensor([[1], [1], [0]]), torch.tensor([1, 1, 0])
    # p/q for token 1 = 2/3: row 0 accepts (u 0.5 < 2/3) and draws the bonus from p[1] with u 0.95;
    # row 1 rejects (u 0.9) and draws from the residual max(0, p - q) = [0.25, 0, 0]: token 0;
    # row 2 drafted nothing and draws from p[0] with u 0.6: token 1.
    accept_u = torch.tensor([[0.5, 0.0], [0.9, 0.0], [0.0, 0.0]], dtype=torch.float64)
    residual_u = torch.tensor([[0.0, 0.0], [0.99, 0.0], [0.0, 0.0]], dtype=torch.float64)
    target_u = torch.tensor([[0.0, 0.95], [0.0, 0.0], [0.6, 0.0]], dtype=torch.float64)
    accepted, token = rejection_chains(p, q, tokens, lengths, accept_u, residual_u, target_u)
    assert accepted.tolist() == [1, 0, 0] and token.tolist() == [2, 0, 1]


def test_rejection_chains_at_the_acceptance_boundary_with_no_draft_and_with_no_residual():
    """Accept a drafted x exactly when u < p(x)/q(x); rejected, draw from max(0, p − q) of that row alone;
    no draft at all, draw from p; no residual left by rounding (q over p everywhere), draw from p."""
    p = torch.tensor([[[0.625, 0.375, 0.0], [0.0, 0.3, 0.7]]], dtype=torch.float64)  # [1, 2, 3]
    q = torch.tensor([[[0.25, 0.75, 0.0]]], dtype=torch.float64)  # p/q for token 1: exactly 0.5
    tokens, lengths = torch.tensor([[1]]), torch.tensor([1])
    residual_u, target_u = torch.tensor([[0.99, 0.0]]), torch.tensor([[0.0, 0.0]])
    for u, expected in ((0.5, ([0], [0])), (0.4999, ([1], [1]))):
        accepted, token = rejection_chains(p, q, tokens, lengths, torch.tensor([[u, 0.0]]), residual_u, target_u)
        assert (accepted.tolist(), token.tolist()) == expected
    # No draft: the rows draw from p at slot 0.
    flat = torch.tensor([[[0.2, 0.3, 0.5]]], dtype=torch.float64).expand(2, 1, 3)
    none = torch.zeros(2, 0, dtype=torch.long)
    u = torch.tensor([[0.1], [0.6]], dtype=torch.float64)
    accepted, token = rejection_chains(flat, torch.zeros(2, 0, 3), none, torch.tensor([0, 0]), u, u, u)
    assert accepted.tolist() == [0, 0] and token.tolist() == [0, 2]
    # Row 0: q over p everywhere (a draft's rounding), token 0 rejected (u 0.9 >= 0.5/0.6): a draw from
    # p. Row 1: the same p, q one-hot on 1, rejected: the residual [0.5, 0, 0].
    p = torch.tensor([[0.5, 0.5, 0.0], [0.1, 0.1, 0.8]], dtype=torch.float64).expand(2, 2, 3)
    q = torch.tensor([[[0.6, 0.5, 0.1]], [[0.0, 1.0, 0.0]]], dtype=torch.float64)
    u = torch.tensor([[0.9, 0.0], [0.9, 0.0]], dtype=torch.float64)
    residual_u = torch.tensor([[0.7, 0.0], [0.7, 0.0]], dtype=torch.float64)
    accepted, token = rejection_chains(p, q, torch.tensor([[0], [1]]), torch.tensor([1, 1]), u, residual_u, u)
    assert accepted.tolist() == [0, 0] and token.tolist() == [1, 0]


def test_slot_uniforms_are_keyed_by_row_and_position():
    slots = Slots(seed=3, keys=torch.tensor([7, 8]), positions=torch.tensor([[4, 5], [9, 4]]))
    uniforms = slots.uniforms(STREAM_ACCEPT)
    for (b, s), (key, position) in {(0, 0): (7, 4), (0, 1): (7, 5), (1, 0): (8, 9), (1, 1): (8, 4)}.items():
        assert uniforms[b, s] == keyed_uniform(3, torch.tensor([key]), torch.tensor([position]), STREAM_ACCEPT)[0]
    assert uniforms[0, 0] != uniforms[1, 1] and not torch.equal(uniforms, slots.uniforms(STREAM_TARGET))


def test_a_deterministic_draft_of_the_targets_certain_token_is_always_accepted():
    """A draft without probabilities counts as one-hot q: p(x)/q(x) = 1 when the target is certain of x."""
    logits = torch.zeros(16, 2, 4, dtype=torch.float64)
    logits[:, 0, 1] = 100.0  # p(1) = 1 at slot 0, for every row's own uniforms
    slots = Slots(seed=0, keys=torch.arange(16), positions=torch.zeros(16, 2, dtype=torch.long))
    verdicts = accept(RejectionSampling(), logits, [Draft.chain([1])] * 16, slots, SamplingParams(temperature=1.0))
    assert all(v.accepted_slots == [1] for v in verdicts)


def test_rejection_sampling_keeps_the_target_on_its_device_and_brings_the_drafts_there():
    """On a GPU the verify forward's logits and a draft model's probabilities live on the device, the
    keyed uniforms on the CPU: every tensor must meet on the target's device, nothing may leave it
    before the verdict (the rule once moved p to the CPU, so sampled speculation on a GPU raised and
    decoded plainly). `meta` stands for the device: any tensor of the wrong device in the arithmetic raises."""
    sampling = SamplingParams(temperature=0.8, top_p=0.9)
    slots = Slots(seed=3, keys=torch.tensor([7, 8]), positions=torch.tensor([[4, 5, 6], [9, 10, 11]]))
    logits = torch.randn(2, 3, 5, device="meta")
    on_device = Draft.chain([1, 2], torch.full((2, 5), 0.2, device="meta"))
    on_cpu = Draft.chain([3], torch.full((1, 5), 0.2))  # a draft model on another device than the target
    decided = decide_rejection_sampling(logits, [on_device, on_cpu], slots, sampling)
    assert decided.device.type == "meta" and decided.shape == (2, 2)
    deterministic = Draft.chain([4])  # no probabilities: one-hot q, built on the target's device
    assert decide_rejection_sampling(logits, [deterministic, on_device], slots, sampling).device.type == "meta"


def test_rejection_sampling_verdicts_on_a_batch_of_mixed_chains():
    """The rule's verdicts are `rejection_chains`' on the keyed uniforms of each row's slots."""
    sampling = SamplingParams(temperature=1.0)
    logits = torch.log(torch.tensor([[[0.5, 0.5, 0.0], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]]] * 2, dtype=torch.float64))
    q = torch.tensor([[0.25, 0.75, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    drafts = [Draft.chain([1, 2], q), Draft.chain([1])]  # the second: one-hot q, accepted with p(1) = 0.5
    slots = Slots(seed=11, keys=torch.tensor([5, 6]), positions=torch.tensor([[0, 1, 2], [0, 1, 1]]))
    verdicts = accept(RejectionSampling(), logits, drafts, slots, sampling)
    one_hot = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]], dtype=torch.float64)
    expected = rejection_chains(
        logits.exp(),
        torch.cat([q[None], one_hot]),
        torch.tensor([[1, 2], [1, 0]]),
        torch.tensor([2, 1]),
        slots.uniforms(1),
        slots.uniforms(2),
        slots.uniforms(0),
    )
    for v, d, a, t in zip(verdicts, drafts, *(x.tolist() for x in expected), strict=True):
        assert v.accepted_slots == list(range(1, a + 1)) and v.tokens == [*d.tokens[:a], t]


def test_speculative_sampling_preserves_the_target_distribution_along_the_whole_chain():
    """Chi-square over 8000 steps of a 2-token chain and its bonus, on a 3-token vocabulary, where the
    target's and the draft's distributions at each position depend on the tokens before it.

    A step emits 1 to 3 tokens; the rest of the 3 are then drawn from the target itself, as the next
    steps would. The joint of the 3 tokens must be the target's: p0(x1) p1(x2 | x1) p2(x3 | x1, x2).
    The 8000 steps are the rows of one batch.
    """
    generator = torch.Generator().manual_seed(0)

    def distributions(*shape: int) -> torch.Tensor:
        weights = torch.rand(*shape, 3, generator=generator, dtype=torch.float64) + 0.2
        return weights / weights.sum(-1, keepdim=True)

    p0, p1, p2 = distributions(), distributions(3), distributions(3, 3)  # target, given the tokens before
    q0, q1 = distributions(), distributions(3)  # draft, given the tokens before

    def draw(probs: torch.Tensor, u: float) -> int:
        """The token whose share of [0, 1) holds `u`."""
        return sum(u >= c for c in probs.cumsum(0)[:-1].tolist())

    trials = 8000  # the least likely of the 27 outcomes is still expected 95 times
    uniforms = torch.rand(trials, 9, generator=generator, dtype=torch.float64)
    first = [draw(q0, float(u[0])) for u in uniforms]
    second = [draw(q1[a], float(u[1])) for a, u in zip(first, uniforms, strict=True)]
    # Per row: the target at each slot of the chain [3, V], and the draft's [2, V].
    p = torch.stack([torch.stack([p0, p1[a], p2[a, b]]) for a, b in zip(first, second, strict=True)])
    q = torch.stack([torch.stack([q0, q1[a]]) for a in first])
    zeros = torch.zeros(trials, 1, dtype=torch.float64)
    accepted, token = rejection_chains(
        p,
        q,
        torch.tensor([first, second]).T,
        torch.full((trials,), 2),
        torch.cat([uniforms[:, 2:4], zeros], dim=1),
        torch.cat([uniforms[:, 4:6], zeros], dim=1),
        torch.cat([zeros, zeros, uniforms[:, 6:7]], dim=1),
    )
    counts = torch.zeros(3, 3, 3, dtype=torch.float64)
    for a, b, n, t, u in zip(first, second, accepted.tolist(), token.tolist(), uniforms, strict=True):
        tokens = [*[a, b][:n], t]
        if len(tokens) < 2:
            tokens.append(draw(p1[tokens[0]], float(u[7])))
        if len(tokens) < 3:
            tokens.append(draw(p2[tokens[0], tokens[1]], float(u[8])))
        counts[tuple(tokens)] += 1
    expected = p0[:, None, None] * p1[:, :, None] * p2 * trials
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 54.05, (chi2, counts)  # 26 degrees of freedom, p = 0.001


def test_typical_walk_on_literal_distributions():
    """Accept x at a slot when p(x) > min(ε, δ·exp(−H(p))); the deepest passing node wins, then Σ log p."""
    certain = [1.0, 0.0, 0.0, 0.0]  # H = 0: the threshold is min(ε, δ)
    flat = [0.25, 0.25, 0.25, 0.25]  # H = ln 4: δ·exp(−H) = δ / 4
    # pending -> a(1) -> c(2); pending -> b(3); slot 0 is flat, slot 1 (a) certain of 2, slot 2 (b) flat.
    draft = Draft(tokens=[1, 3, 2], parents=[-1, -1, 0])
    probs = torch.tensor([flat, [0.0, 0.0, 1.0, 0.0], flat, certain], dtype=torch.float64)
    chosen = [0, 2, 0, 0]
    # ε = 0.3, δ = 0.8: slot 0's threshold is min(0.3, 0.2) = 0.2 < 0.25: a and b pass; a's child too.
    verdict = typical_walk(draft, probs, chosen, epsilon=0.3, delta=0.8)
    assert verdict.accepted_slots == [1, 3] and verdict.tokens == [1, 2, 0]
    # δ = 1.2: threshold min(0.3, 0.3) = 0.3 > 0.25: nothing passes at slot 0; the target's own token.
    assert typical_walk(draft, probs, chosen, epsilon=0.3, delta=1.2).tokens == [0]
    # Two passing leaves at one depth: the one with the higher Σ log p.
    siblings = Draft(tokens=[1, 2], parents=[-1, -1])
    skewed = torch.tensor([[0.1, 0.3, 0.6, 0.0], flat, flat], dtype=torch.float64)
    assert typical_walk(siblings, skewed, [2, 0, 0], epsilon=0.05, delta=0.1).accepted_slots == [2]
    assert typical_walk(Draft.empty(), skewed, [2], epsilon=0.05, delta=0.1).tokens == [2]
    # Equal leaves: the first listed wins. A token the target gives p = 0 fails without a log of 0.
    tied = torch.tensor([[0.0, 0.5, 0.5, 0.0], flat, flat], dtype=torch.float64)
    assert typical_walk(siblings, tied, [1, 0, 0], epsilon=0.05, delta=0.1).accepted_slots == [1]
    assert typical_walk(Draft([3], [-1]), tied, [1, 0], epsilon=0.05, delta=0.1).tokens == [1]


def test_typical_walk_compares_each_node_with_its_parents_slot_strictly():
    """p(x) must exceed the threshold of the slot x was drafted at: equal is not enough."""
    certain = [1.0, 0.0, 0.0, 0.0]  # threshold min(ε, δ) = ε
    draft = Draft(tokens=[1, 2], parents=[-1, 0])  # a chain: 1 at slot 0, 2 at slot 1
    at_slot_0 = [0.0, 0.25, 0.0, 0.75]  # p(1) = 0.25
    probs = torch.tensor([at_slot_0, [0.0, 0.0, 0.5, 0.5], certain], dtype=torch.float64)
    assert typical_walk(draft, probs, [3, 3, 0], epsilon=0.25, delta=10.0).tokens == [3]  # 0.25 is not > 0.25
    assert typical_walk(draft, probs, [3, 3, 0], epsilon=0.24, delta=10.0).tokens == [1, 2, 0]
    # Thresholds δ·exp(−H) of 0.255, 0.262 and 0.5 at slots 0, 1, 2: node 2 (p 0.35 at slot 1) passes
    # slot 1's, not slot 2's.
    spread = [[0.0, 0.4, 0.0, 0.6], [0.0, 0.0, 0.35, 0.65], certain]
    assert typical_walk(draft, torch.tensor(spread, dtype=torch.float64), [3, 3, 0], 1.0, 0.5).tokens == [1, 2, 0]


def test_typical_acceptance_matches_medusas_reference():
    """FasterDecoding/Medusa's `evaluate_posterior` (typical, fast): exact matching at temperature 0;
    H = −Σ p·log(p + 1e-5); otherwise as `typical_walk`, the token after the path being the target's
    keyed sample here (the reference's argmax would make every sample of a row the same)."""
    rule = Typical(epsilon=0.09, delta=0.3)
    # Slot 0: the target prefers token 0 (p 0.6), the draft says 1 (p 0.4): typical accepts 1, greedy does not.
    logits = torch.log(torch.tensor([[[0.6, 0.4, 0.0], [0.1, 0.1, 0.8]]], dtype=torch.float64))
    chain = Draft.chain([1])
    slots = Slots(seed=5, keys=torch.tensor([3]), positions=torch.tensor([[0, 1]]))
    assert accept(rule, logits, [chain], slots, SamplingParams()) == accept(
        ExactMatch(), logits, [chain], slots, SamplingParams()
    )
    assert accept(rule, logits, [chain], slots, SamplingParams())[0].tokens == [0]
    sampled = SamplingParams(temperature=1.0, seed=5)
    verdict = accept(rule, logits, [chain], slots, sampled)[0]
    assert verdict.accepted_slots == [1]
    assert verdict.tokens == [1, target_choices(logits, slots, sampled)[0][1]]
    # The reference's entropy: nearly flat p puts δ·exp(−H) at 0.25001, above p(0) = 0.250005 (the
    # exact entropy's would be 0.2500000000, below it): token 0 is not accepted.
    nearly_flat = torch.tensor([[0.250005, 0.25, 0.25, 0.249995], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert typical_walk(Draft.chain([0]), nearly_flat, [1, 0], epsilon=1.0, delta=1.0).accepted_slots == []
    assert typical_walk(Draft.chain([0]), nearly_flat, [1, 0], epsilon=1.0, delta=0.99).accepted_slots == [1]


def test_top_k_relaxed_acceptance_takes_any_token_among_the_targets_top_k():
    chain = Draft.chain([1, 3])
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0], [0.0, 1.0, 2.0, 3.0 - 1e-3], [0.0, 9.0, 0.0, 0.0]])
    top2 = accept(Relaxed(top_beta=2), logits[None], [chain], None, SamplingParams())[0]
    assert top2.tokens == [1, 3, 1]  # 1 is 2nd at slot 0, 3 is 1st at slot 1, then the argmax 1
    top1 = accept(Relaxed(top_beta=1), logits[None], [chain], None, SamplingParams())[0]
    assert top1.tokens == [0]  # top-1 is exact greedy: the first draft token fails
    assert Relaxed(top_beta=2).refusal(greedy=False, trees=False).endswith("use generation.temperature=0")
    assert Relaxed(top_beta=2).refusal(greedy=True, trees=True) is None


def test_rejection_sampling_refuses_trees_and_exact_matching_takes_them():
    refusal = RejectionSampling().refusal(greedy=False, trees=True)
    assert refusal.startswith("rejection sampling verifies chains: testing several children against one p")
    assert refusal.endswith("repeats chances and biases the output; verify trees with exact matching instead")
    assert RejectionSampling().refusal(greedy=True, trees=True) is None
    assert ExactMatch().refusal(greedy=False, trees=True) is None
    tree = Draft([1, 2], [-1, -1], probs=torch.full((2, 4), 0.25, dtype=torch.float64))
    slots = Slots(seed=0, keys=torch.tensor([7]), positions=torch.tensor([[0, 1, 1]]))
    with pytest.raises(ValueError, match="chains"):
        accept(RejectionSampling(), torch.zeros(1, 3, 4), [tree], slots, SamplingParams(temperature=1.0))


@pytest.mark.parametrize("rule", [RejectionSampling(), Typical(epsilon=0.3, delta=0.09)])
def test_greedy_rules_take_trees_by_exact_matching(rule):
    """At temperature 0 rejection sampling and typical acceptance are exact matching, trees included."""
    tree = Draft(tokens=[1, 2, 3], parents=[-1, -1, 1])  # 2 and 1 below the pending token, 3 below 2
    logits = torch.zeros(2, 4, 4)
    logits[0, 0, 2] = logits[0, 2, 3] = logits[0, 3, 0] = 1.0  # row 0: the target agrees with 2, then 3
    logits[1, 0, 3] = 1.0  # row 1: it wants 3 at once
    slots = Slots(seed=0, keys=torch.tensor([1, 2]), positions=torch.zeros(2, 4, dtype=torch.long))
    verdicts = accept(rule, logits, [tree, tree], slots, SamplingParams())
    assert [(v.accepted_slots, v.tokens) for v in verdicts] == [([2, 3], [2, 3, 0]), ([], [3])]
