"""Medusa's typical acceptance through a whole speculative step, on a target with literal distributions.

Typical acceptance is a rule of sampling (at temperature 0 it is exact matching, as the reference's), so
the step runs at temperature 1, where the filtered probabilities are the literal table. Tokens 4 and 5
lead with probability 1 to 1 and 3, so each row's pending token is known before the step.

Checked by hand: with the deepest-path rule replaced by the first passing child (`typical_walk`
taking `best` at the first pass), and with the threshold's min(ε, ·) made a max, the test fails.
"""

from __future__ import annotations

import torch
from bigram_model import bigram_model

from strategies.base import GenerationParams, RowRequest
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from strategies.verification.drafting import DraftingMethod
from strategies.verification.drafts import Draft
from strategies.verification.proposer import Proposer
from strategies.verification.rules import Typical
from strategies.verification.speculative import SpeculativeStrategy

# The target's next-token distribution after each token (vocabulary 8: a Llama's heads need an even width).
TINY = 1e-30
AFTER = torch.tensor(
    [
        [0.10, 0.50, 0.30, 0.10, TINY, TINY, TINY, TINY],  # after 0
        [0.05, 0.15, 0.35, 0.45, TINY, TINY, TINY, TINY],  # after 1: H = 1.161, δ·exp(−H) = 0.094 > ε: 0.09
        [0.20, 0.20, 0.20, 0.40, TINY, TINY, TINY, TINY],  # after 2: H = 1.332, threshold δ·exp(−H) = 0.079
        [0.02, 0.15, 0.02, 0.81, TINY, TINY, TINY, TINY],  # after 3: H = 0.612, δ·exp(−H) = 0.163 > ε: 0.09
        [TINY, 1.00, TINY, TINY, TINY, TINY, TINY, TINY],  # after 4: 1
        [TINY, TINY, TINY, 1.00, TINY, TINY, TINY, TINY],  # after 5: 3
        [0.25, 0.25, 0.25, 0.25, TINY, TINY, TINY, TINY],
        [0.25, 0.25, 0.25, 0.25, TINY, TINY, TINY, TINY],
    ],
    dtype=torch.float64,
)
# Below the pending token: a = 2 -> c = 0, and b = 3 -> d = 1.
TREE = Draft(tokens=[2, 3, 0, 1], parents=[-1, -1, 0, 1])


class OneTreeProposer(Proposer[None]):
    """Drafts TREE for every row at its first call, nothing after."""

    name = "medusa"

    def __init__(self) -> None:
        self.calls = 0

    def new_row_state(self, context: list[int]) -> None:
        return None

    def propose(self, context):
        self.calls += 1
        return [TREE if self.calls == 1 else Draft.empty() for _ in context.budgets]


def test_typical_acceptance_takes_the_deepest_typical_path_not_the_greedy_one():
    """ε = 0.09, δ = 0.3 (Medusa's defaults), temperature 1. Row 0, prompt [4]: the prefill emits 1.
    After 1, a (p 0.35) and b (p 0.45, the target's argmax) both pass 0.09; c passes after a
    (0.2 > 0.079), d after b (0.15 > 0.09, though not δ·exp(−H) = 0.163). Two paths of depth 2: the
    higher Σ log p wins, a -> c (0.35·0.2 = 0.07 against 0.45·0.15 = 0.0675), although greedy decoding
    would take b: the step emits 2, 0, then the target's keyed sample after 0.
    Row 1, prompt [5]: the prefill emits 3; after 3, a fails (0.02), b passes (0.81), then d: the step
    emits 3, 1, then the keyed sample after 1. Later tokens are plain steps' samples."""
    target = ModelRunner(bigram_model(AFTER.log()))
    drafter = DraftingMethod("medusa", OneTreeProposer(), 2, len(TREE), Typical(epsilon=0.09, delta=0.3), trees=True)
    strategy = SpeculativeStrategy("medusa", target, [drafter])
    params = GenerationParams(5, SamplingParams(temperature=1.0, seed=7), eos_token_ids=frozenset(), ignore_eos=True)
    out = strategy.generate([RowRequest(prompt=[4], key=0), RowRequest(prompt=[5], key=1)], params)
    assert [r.tokens[:3] for r in out.rows] == [[1, 2, 0], [3, 3, 1]]
    assert out.stats["accepted_tokens"] == 4  # a and c in row 0, b and d in row 1


def test_typical_acceptance_at_temperature_0_is_exact_matching():
    """Greedy, the same tree: row 0 keeps b (the argmax after 1) and rejects d (after 3 the argmax is
    3), so the step emits 3, then 3: greedy decoding's tokens, not the typical path's."""
    target = ModelRunner(bigram_model(AFTER.log()))
    drafter = DraftingMethod("medusa", OneTreeProposer(), 2, len(TREE), Typical(epsilon=0.09, delta=0.3), trees=True)
    strategy = SpeculativeStrategy("medusa", target, [drafter])
    params = GenerationParams(4, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    out = strategy.generate([RowRequest(prompt=[4], key=0)], params)
    assert out.rows[0].tokens == [1, 3, 3, 3]
    assert out.stats["accepted_tokens"] == 1  # b
