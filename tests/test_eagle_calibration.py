"""EAGLE-2's dynamic tree ranked at temperature 0 on acceptance calibrated from the verifier's verdicts."""

from __future__ import annotations

import math

import pytest
import torch
from mixed_prompts import PROMPTS
from test_eagle import _params, _tokens, tiny_eagle
from transformers import AutoModelForCausalLM

from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.proposers.eagle import EagleProposer
from strategies.proposers.eagle_tree import (
    Calibration,
    Grown,
    calibrated_values,
    drafts_of,
    grow,
    offered_nodes,
    ranked_nodes,
    verdicts,
)
from strategies.runtime.runner import ModelRunner
from strategies.verification.drafting import DraftingMethod
from strategies.verification.speculative import SpeculativeStrategy

# Two depth-1 children of the pending token (confidences 0.45 and 0.35), two below the first (0.4, 0.3)
# and one below that (0.45): raw path values 0.45, 0.35, 0.18, 0.135, 0.081.
CONFIDENCES = [0.45, 0.35, 0.4, 0.3, 0.45]
PARENTS = [-1, -1, 0, 0, 2]
TOKENS = [10, 11, 20, 21, 30]
DEPTHS = [1, 1, 2, 2, 3]
RANKS = [0, 1, 0, 1, 0]


def _grown() -> Grown:
    values = []
    for confidence, parent in zip(CONFIDENCES, PARENTS, strict=True):
        values.append(math.log(confidence) + (values[parent] if parent >= 0 else 0.0))
    return Grown(
        torch.tensor([TOKENS]),
        torch.tensor([PARENTS]),
        torch.tensor([values], dtype=torch.float64),
        torch.tensor([DEPTHS]),
        torch.tensor([RANKS]),
    )


def test_the_calibrated_ranking_on_literal_verdicts_orders_nodes_as_a_hand_computation_does():
    """Verdicts: at depth 1 the top-1's 0.4–0.5 bin accepted 9 of 10, the second's 0.3–0.4 bin 1 of 10; at
    depth 2 the top-1's 0.4–0.5 bin 8 of 10; at depth 3 the top-1's 0.4–0.5 bin 9 of 10. Each chance is a
    bin's acceptance shrunk by 4 verdicts toward the wider bin's above it: the top-1's rank (26 + 4 · 0.6) /
    34 = 0.8353, its 0.4–0.5 bin over every depth (26 + 4 · 0.8353) / 34 = 0.8630, that bin at depth 1 or
    3 (9 + 4 · 0.8630) / 14 = 0.8894, at depth 2 (8 + 4 · 0.8630) / 14 = 0.8180; the second's rank (1 + 4 ·
    0.24) / 14 = 0.14, its 0.3–0.4 bin (1 + 4 · 0.14) / 14 = 0.1114, at depth 1 (1 + 4 · 0.1114) / 14 =
    0.1033, at depth 2 (no verdicts) 0.1114. Paths: 0.8894, 0.1033, 0.8894 · 0.8180, 0.8894 · 0.1114,
    0.8894 · 0.8180 · 0.8894. Three nodes: the raw values keep the bushy root (nodes 0, 1, 2), the
    calibrated ones the chain (0, 2, 4)."""
    calibration = Calibration()
    verdicts_by_bin = ((1, 0, 0.45, 9, 10), (1, 1, 0.35, 1, 10), (2, 0, 0.4, 8, 10), (3, 0, 0.45, 9, 10))
    for depth, rank, confidence, accepted, offered in verdicts_by_bin:
        for i in range(offered):
            calibration.record(depth, rank, confidence, i < accepted)
    top_rank = (26 + 4 * 0.6) / 34
    top_bin = (26 + 4 * top_rank) / 34
    top_at_1, top_at_2 = (9 + 4 * top_bin) / 14, (8 + 4 * top_bin) / 14
    second_bin = (1 + 4 * (1 + 4 * 0.24) / 14) / 14
    second_at_1 = (1 + 4 * second_bin) / 14
    expected = [top_at_1, second_at_1, top_at_1 * top_at_2, top_at_1 * second_bin, top_at_1 * top_at_2 * top_at_1]
    values = calibrated_values(_grown(), calibration)
    assert [math.exp(v) for v in values[0]] == pytest.approx(expected)
    assert ranked_nodes(_grown(), [3], 3) == [[0, 1, 2]]
    assert ranked_nodes(_grown(), [3], 3, values) == [[0, 2, 4]]
    order = sorted(range(5), key=lambda n: -values[0][n])
    assert order == [0, 2, 4, 1, 3]


def test_before_any_verdict_the_calibrated_ranking_is_the_static_trees():
    """0.6 for a top-1 and 0.24 for a second, whatever the head's confidence: the paths' chances 0.6, 0.24,
    0.36, 0.144 and 0.216 rank the nodes as EAGLE-1's static tree does."""
    values = calibrated_values(_grown(), Calibration())
    assert [math.exp(v) for v in values[0]] == pytest.approx([0.6, 0.24, 0.36, 0.144, 0.216])


def test_verdicts_judge_the_children_of_every_accepted_node():
    """The row emitted 10, then 21 (the draft's node 3), then the target's own 99: nodes 0 and 3 accepted,
    their siblings 1 and 2 rejected; node 4, below a rejected node, never judged."""
    offered = offered_nodes(_grown(), [[0, 1, 2, 3, 4]])[0]
    assert [(parent, token, depth, rank) for parent, token, depth, rank, _ in offered] == list(
        zip(PARENTS, TOKENS, DEPTHS, RANKS, strict=True)
    )
    assert [confidence for *_, confidence in offered] == pytest.approx(CONFIDENCES)
    judged = verdicts(offered, [10, 21, 99])
    assert [(d, r, round(c, 2), a) for d, r, c, a in judged] == [
        (1, 0, 0.45, True),
        (1, 1, 0.35, False),
        (2, 0, 0.4, False),
        (2, 1, 0.3, True),
    ]


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_calibrated_dynamic_tree_learns_at_temperature_0_only_and_keeps_the_output(
    target, tiny_model_dir, temperature
):
    params = _params(20, temperature=temperature, seed=3)
    reference = _tokens(AutoregressiveStrategy(target), PROMPTS[:3], params)
    proposer = EagleProposer(tiny_eagle(target, tiny_model_dir), top_k=3)
    strategy = SpeculativeStrategy("eagle", target, [DraftingMethod("eagle", proposer, 4, 8, trees=True)])
    assert _tokens(strategy, PROMPTS[:3], params) == reference
    judged = sum(offered for _, offered in proposer.calibration.counts.values())
    assert (judged > 0) == (temperature == 0.0)


def test_a_dynamic_tree_grows_no_wider_than_its_node_budget_and_keeps_the_same_nodes():
    """A frontier of top_k 4 where 2 nodes are kept costs head work for nodes never verified: grown 2 wide,
    the 2 nodes of highest confidence are the same."""
    torch.manual_seed(0)
    table = torch.log_softmax(torch.randn(32, 32, dtype=torch.float64) * 3, dim=-1)  # next token's by token

    def expand(tokens, parents, depth):
        return table[tokens]

    root = table[torch.tensor([1, 7, 12])]
    for nodes in (1, 2, 3):
        wide = ranked_nodes(grow(root, 3, 4, expand), [3, 3, 3], nodes)
        narrow = ranked_nodes(grow(root, 3, nodes, expand), [3, 3, 3], nodes)
        assert drafts_tokens(grow(root, 3, 4, expand), wide) == drafts_tokens(grow(root, 3, nodes, expand), narrow)


def drafts_tokens(grown, kept):
    return [(draft.tokens, draft.parents) for draft in drafts_of(grown, kept)]
