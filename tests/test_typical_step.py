"""Medusa's typical acceptance through a whole speculative step, on a target with literal distributions.

Checked by hand: with the deepest-path rule replaced by the first passing child (`typical_walk`
taking `best` at the first pass), and with the threshold's min(ε, ·) made a max, the test fails.
"""

from __future__ import annotations

import torch
from bigram_model import bigram_model

from strategies.base import GenerationParams, RowRequest
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from strategies.verification.acceptance import Typical
from strategies.verification.drafts import Draft
from strategies.verification.speculative import Drafter, SpeculativeStrategy

# The target's next-token distribution after each token.
AFTER = torch.tensor(
    [
        [0.10, 0.50, 0.30, 0.10],  # after 0
        [0.05, 0.15, 0.35, 0.45],  # after 1: H = 1.161, δ·exp(−H) = 0.094 > ε: threshold 0.09
        [0.20, 0.20, 0.20, 0.40],  # after 2: H = 1.332, threshold δ·exp(−H) = 0.079
        [0.02, 0.15, 0.02, 0.81],  # after 3: H = 0.612, δ·exp(−H) = 0.163 > ε: threshold 0.09
    ],
    dtype=torch.float64,
)
# Below the pending token: a = 2 -> c = 0, and b = 3 -> d = 1.
TREE = Draft(tokens=[2, 3, 0, 1], parents=[-1, -1, 0, 1])


class OneTreeProposer:
    """Drafts TREE for every row at its first call, nothing after."""

    name = "medusa"
    wants_states = False

    def start(self, contexts, keys, params, states) -> None:
        self.calls = 0

    def propose(self, context):
        self.calls += 1
        return [TREE if self.calls == 1 else Draft.empty() for _ in context.budgets]

    def emitted(self, emitted, states) -> None:
        pass

    def keep_rows(self, rows) -> None:
        pass

    def stats(self) -> dict[str, float]:
        return {}


def test_typical_acceptance_takes_the_deepest_typical_path_not_the_greedy_one():
    """ε = 0.09, δ = 0.3 (Medusa's defaults), greedy. Row 0, prompt [0]: the prefill emits 1 (0.5).
    After 1, a (p 0.35) and b (p 0.45, the target's argmax) both pass 0.09; c passes after a
    (0.2 > 0.079), d after b (0.15 > 0.09, though not δ·exp(−H) = 0.163). Two paths of depth 2: the
    higher Σ log p wins, a -> c (0.35·0.2 = 0.07 against 0.45·0.15 = 0.0675), although greedy decoding
    would take b: the step emits 2, 0, then the target's argmax after 0 (1).
    Row 1, prompt [2]: the prefill emits 3; after 3, a fails (0.02), b passes (0.81), then d: the step
    emits 3, 1, then the argmax after 1 (3). The last tokens are plain steps'."""
    target = ModelRunner(bigram_model(AFTER.log()))
    drafter = Drafter("medusa", OneTreeProposer(), 2, len(TREE), Typical(epsilon=0.09, delta=0.3), trees=True)
    strategy = SpeculativeStrategy("medusa", target, [drafter])
    params = GenerationParams(5, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    out = strategy.generate([RowRequest(prompt=[0], key=0), RowRequest(prompt=[2], key=1)], params)
    assert [r.tokens for r in out.rows] == [[1, 2, 0, 1, 3], [3, 3, 1, 3, 3]]
    assert out.stats["accepted_tokens"] == 4  # a and c in row 0, b and d in row 1
