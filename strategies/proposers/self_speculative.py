"""Self-speculative decoding from the target's own early layers (LayerSkip, Elhoushi et al. 2024;
Draft & Verify, Zhang et al. 2024): lossless, with no second model and no second cache.

The draft is the target cut short: its first E layers, then the exit head at layer E
(`exits.ExitHeads`). Each draft step feeds one token per row through those E layers of the target's
own cache, as provisional columns (`kv_cache.Provisional`): the pending token first, then each
drafted token. The verifier's forward (`strategies.verification.verify`, through `ModelRunner.forward`) finds
those columns holding exactly the tokens it verifies and reuses them: layers < E run only for the
tokens the draft never fed (the last drafted one), layers >= E over the whole chain from the states
the draft left at layer E. So nothing is computed twice, and what the verifier checks is the full
model's output, which keeps the method lossless: greedy output is the target's, and sampled drafts
carry their exit-head probabilities for speculative sampling (`rules.RejectionSampling`).

A row's draft stops early after a token its exit head gives less than `min_confidence` (Draft &
Verify's adaptive draft length): the stop depends on the draft alone, so it changes what a step
costs, never what it emits.

A plain step that follows a draft (every row's draft empty, a proposer that raised) reuses the
pending token's column the same way; any other forward drops the provisional columns.
"""

from __future__ import annotations

import torch

from strategies.artifacts.exits import ExitHeads
from strategies.base import GenerationParams
from strategies.runtime.kv_cache import RaggedKV
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import STREAM_DRAFT, filtered_probs, greedy_tokens, keyed_uniform, sample_from
from strategies.runtime.target_states import TargetStates
from strategies.verification.drafts import Draft
from strategies.verification.proposer import ProposalContext, Proposer


class SelfSpeculativeProposer(Proposer[int]):
    """Drafts chains with the target's first `exit_layer` layers and the exit head there. A row's
    record is its pending token: everything else it reads is the target's."""

    name = "self_speculative"
    shares_cache = True  # it drafts in the batch's own cache (`use_cache`), as provisional columns only
    drafts_per_depth = True

    def __init__(self, runner: ModelRunner, exits: ExitHeads, exit_layer: int, min_confidence: float = 0.0) -> None:
        runner.need_layers()
        exits.exit(exit_layer)  # a ValueError naming the exits there are
        self.runner = runner
        self.exits = exits
        self.exit_layer = exit_layer
        self.min_confidence = min_confidence
        self.kv: RaggedKV | None = None

    def use_cache(self, kv: RaggedKV) -> None:
        """The batch's cache, shared with the target: drafting writes provisional columns only."""
        self.kv = kv

    def start(self, contexts: list[list[int]], params: GenerationParams, states: TargetStates | None) -> None:
        if self.kv is None:
            raise ValueError("self-speculation drafts in the target's cache: the loop must call use_cache first")
        super().start(contexts, params, states)

    def new_row_state(self, context: list[int]) -> int:
        return context[-1]

    def propose(self, context: ProposalContext) -> list[Draft]:
        """Each row's chain; column i of the draft forwards holds the token at verify slot i (the pending
        token, then draft token i), fed while any row still drafts."""
        sampling = self.params.sampling
        device = self.runner.device
        b = len(self.rows)
        tokens: list[list[int]] = [[] for _ in range(b)]
        probs: list[list[torch.Tensor]] = [[] for _ in range(b)]
        drafting = [budget > 0 for budget in context.budgets]
        eos = self.params.eos_token_ids if not self.params.ignore_eos else frozenset()
        generated = torch.tensor(context.num_generated, dtype=torch.long)
        column = list(self.rows)  # [B] the tokens of column 0: the pending ones
        for i in range(max(context.budgets)):
            fed = torch.tensor([i == 0 or len(t) >= i for t in tokens], dtype=torch.bool, device=device)
            ids = torch.tensor(column, dtype=torch.long, device=device)[:, None]  # [B, 1]
            positions = self.kv.next_pos[:, None] + i  # [B, 1]
            hidden = self.runner.forward_early(self.kv, ids, positions, fed[:, None], self.exit_layer)  # [B, 1, D]
            with torch.inference_mode():
                logits = self.exits.logits(self.exit_layer, hidden[:, -1])  # [B, V]
            if sampling.greedy:
                picked = greedy_tokens(logits)  # [B]
                q = logits.softmax(dim=-1) if self.min_confidence > 0 else None
            else:
                q = filtered_probs(logits, sampling)  # [B, V]
                u = keyed_uniform(sampling.seed, context.keys, generated + i, STREAM_DRAFT)
                picked = sample_from(q, u.to(q.device))
            chosen = picked.tolist()
            sure = [True] * b if q is None else (q.gather(1, picked[:, None])[:, 0] >= self.min_confidence).tolist()
            for row in range(b):
                if drafting[row]:
                    tokens[row].append(chosen[row])
                    if not sampling.greedy:
                        probs[row].append(q[row])
                    more = len(tokens[row]) < context.budgets[row] and chosen[row] not in eos
                    drafting[row] = more and sure[row]
            if not any(drafting):
                break
            column = [t[i] if len(t) > i else 0 for t in tokens]
        return [Draft.chain(t, torch.stack(p) if p else None) for t, p in zip(tokens, probs, strict=True)]

    def emitted(self, emitted: list[list[int]], states: TargetStates | None) -> None:
        self.rows = [tokens[-1] for tokens in emitted]

    def stats(self) -> dict[str, float]:
        return {"exit_layer": float(self.exit_layer)}
