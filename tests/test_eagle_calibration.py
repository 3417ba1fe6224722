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


def _grown() -> Grown:
    values = []
    for confidence, parent in zip(CONFIDENCES, PARENTS, strict=True):
        values.append(math.log(confidence) + (values[parent] if parent >= 0 else 0.0))
    return Grown(
        torch.tensor([TOKENS]),
        torch.tensor([PARENTS]),
        torch.tensor([values], dtype=torch.float64),
        torch.tensor([DEPTHS]),
    )


def test_the_calibrated_ranking_on_literal_verdicts_orders_nodes_as_a_hand_computation_does():
    """Verdicts: at depth 1 the 0.4–0.5 bin accepted 9 of 10, the 0.3–0.4 bin 1 of 10; at depth 2 the
    0.4–0.5 bin 8 of 10; at depth 3 the 0.4–0.5 bin 9 of 10; depth 2's 0.3–0.4 bin has none. Each chance is
    the bin's acceptance shrunk toward the confidence by 4 verdicts: (9 + 4·0.45) / 14 = 0.7714 at depth 1,
    (1 + 4·0.35) / 14 = 0.1714, (8 + 4·0.4) / 14 = 0.6857 at depth 2, 0.3 where there are none, and
    (9 + 4·0.45) / 14 at depth 3. Paths: 0.7714, 0.1714, 0.7714·0.6857 = 0.5290, 0.7714·0.3 = 0.2314,
    0.5290·0.7714 = 0.4081. Three nodes: the raw values keep the bushy root (nodes 0, 1, 2), the
    calibrated ones the chain (0, 2, 4)."""
    calibration = Calibration()
    for depth, confidence, accepted, offered in ((1, 0.45, 9, 10), (1, 0.35, 1, 10), (2, 0.4, 8, 10), (3, 0.45, 9, 10)):
        for i in range(offered):
            calibration.record(depth, confidence, i < accepted)
    hand = [9 + 4 * 0.45, 1 + 4 * 0.35, 8 + 4 * 0.4]
    depth_1, depth_1_low, depth_2 = (h / 14 for h in hand)
    expected = [depth_1, depth_1_low, depth_1 * depth_2, depth_1 * 0.3, depth_1 * depth_2 * depth_1]
    values = calibrated_values(_grown(), calibration)
    assert [math.exp(v) for v in values[0]] == pytest.approx(expected)
    assert ranked_nodes(_grown(), [3], 3) == [[0, 1, 2]]
    assert ranked_nodes(_grown(), [3], 3, values) == [[0, 2, 4]]
    order = sorted(range(5), key=lambda n: -values[0][n])
    assert order == [0, 2, 4, 3, 1]


def test_before_any_verdict_the_calibrated_ranking_is_the_papers():
    values = calibrated_values(_grown(), Calibration())
    assert values[0] == pytest.approx(_grown().values[0].tolist())


def test_verdicts_judge_the_children_of_every_accepted_node():
    """The row emitted 10, then 21 (the draft's node 3), then the target's own 99: nodes 0 and 3 accepted,
    their siblings 1 and 2 rejected; node 4, below a rejected node, never judged."""
    offered = offered_nodes(_grown(), [[0, 1, 2, 3, 4]])[0]
    assert [(parent, token, depth) for parent, token, depth, _ in offered] == list(
        zip(PARENTS, TOKENS, DEPTHS, strict=True)
    )
    assert [confidence for *_, confidence in offered] == pytest.approx(CONFIDENCES)
    judged = verdicts(offered, [10, 21, 99])
    assert [(d, round(c, 2), a) for d, c, a in judged] == [
        (1, 0.45, True),
        (1, 0.35, False),
        (2, 0.4, False),
        (2, 0.3, True),
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
