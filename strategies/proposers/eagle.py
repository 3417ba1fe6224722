"""EAGLE (Li et al. 2024): an EAGLE head drafts in the target's feature space: a chain, EAGLE-1's static
tree or EAGLE-2's dynamic tree.

The head (`strategies.artifacts.eagle`) keeps its own small cache per row (`RaggedKV`, one layer),
which holds only inputs made of the target's true features: (f_t, token t+1) at position t. The
target's features arrive with every forward it takes (`TargetStates`, for every kept position:
prefill, verify and plain steps alike) and wait in the row's record until the next proposal feeds
them, all at once. Feeding the last of them (f of the token before the pending one, with the pending
token) predicts the feature the pending token's successor is chosen from: the draft's root.

Drafting then runs in feature space: each drafted node is fed with its parent's predicted feature,
attending to the cache and its own ancestors only, and the target's LM head scores its children over
the head's draft vocabulary (`EagleHead.draft_logits`: the trees' tokens are indices into it, mapped
to the target's ids for the head's next input and for the draft). The tree is EAGLE-2's
(`eagle_tree.grow`, reranked to the node budget by `eagle_tree.rerank`) or EAGLE-1's static shape
(`eagle_tree.static_tree`, grown by `eagle_tree.grow_static`, cut to the budget by
`eagle_tree.first_nodes`). Drafted inputs are made of predicted features, so they are dropped from
the cache as soon as the draft is built: once the target has verified, its true features for the
accepted positions take their place. The cache after a step is thus exactly what a fresh head would
hold over the accepted tokens.

A head started after its batch (a controller turned it on late) has only the features of the
target's forwards from then on: its drafts are still verified exactly, only guessed with less context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strategies.artifacts.eagle import EagleHead
from strategies.base import GenerationParams
from strategies.proposers.eagle_tree import Grown, first_nodes, grow, grow_static, rerank, static_tree
from strategies.runtime.kv_cache import RaggedKV
from strategies.runtime.target_states import TargetStates
from strategies.verification.drafts import Draft
from strategies.verification.proposer import ProposalContext, Proposer


@dataclass
class _EagleRow:
    context: list[int]  # prompt and generated tokens, the pending one last
    # [n, H] the target's features not fed to the head yet: those of the n positions before the pending
    # token (the last chose it); each is fed with the token after it.
    features: torch.Tensor


class EagleProposer(Proposer[_EagleRow]):
    """One record per row, and the head's cache of every row (`kv`, rows in the records' order)."""

    name = "eagle"
    wants_hidden_states = True

    def __init__(self, head: EagleHead, top_k: int, static_nodes: int = 0) -> None:
        self.head = head
        self.top_k = top_k  # children per expanded node, and nodes expanded per level; 1: a chain
        self.static_nodes = static_nodes  # > 0: EAGLE-1's static tree of that many nodes, ranks below top_k

    @property
    def device(self) -> torch.device:
        return self.head.fc.weight.device

    def start(self, contexts: list[list[int]], params: GenerationParams, states: TargetStates | None) -> None:
        super().start(contexts, params, states)
        with torch.no_grad():
            self.weights = self.head.layer_weights()  # fused once per batch, not per draft step
        self.kv = RaggedKV(1, len(contexts), self.device)
        for b, row in enumerate(self.rows):
            row.features = _kept_features(states, b)

    def add_rows(self, contexts: list[list[int]], states: TargetStates | None) -> None:
        first = len(self.rows)
        super().add_rows(contexts, states)
        self.kv.extend(RaggedKV(1, len(contexts), self.device))
        for b, row in enumerate(self.rows[first:]):
            row.features = _kept_features(states, b)

    def new_row_state(self, context: list[int]) -> _EagleRow:
        nothing = torch.zeros(0, self.head.config.hidden_size, dtype=self.head.fc.weight.dtype, device=self.device)
        return _EagleRow(list(context), nothing)  # its features: those of the states it joins with

    def keep_rows(self, rows: list[int]) -> None:
        super().keep_rows(rows)
        if rows:
            self.kv.select_rows(torch.tensor(rows, dtype=torch.long, device=self.device))

    def emitted(self, emitted: list[list[int]], states: TargetStates | None) -> None:
        for b, (row, tokens) in enumerate(zip(self.rows, emitted, strict=True)):
            row.context.extend(tokens)
            row.features = torch.cat([row.features, _kept_features(states, b)])

    @torch.inference_mode()
    def propose(self, context: ProposalContext) -> list[Draft]:
        root = self._feed_target_features()  # [B, H] the predicted feature below each pending token
        depth = max(context.budgets)
        grown = self._grow(root, depth) if depth else None
        self.kv.compact_if_wasteful()
        if grown is None:
            return [Draft.empty() for _ in context.budgets]
        if self.static_nodes:
            return first_nodes(grown, context.budgets, context.max_nodes)
        return rerank(grown, context.budgets, context.max_nodes)

    def _feed_target_features(self) -> torch.Tensor:
        """Feed every row's waiting (true feature, next token) pairs to the head's cache: [B, H], per
        row the predicted feature of the pending token's position."""
        rows, kv = self.rows, self.kv
        counts = [len(row.features) for row in rows]
        width, hidden = max(counts), self.head.config.hidden_size
        features = torch.zeros(len(rows), width, hidden, dtype=self.head.fc.weight.dtype, device=self.device)
        tokens = torch.zeros(len(rows), width, dtype=torch.long)
        positions = torch.zeros(len(rows), width, dtype=torch.long)
        valid = torch.zeros(len(rows), width, dtype=torch.bool)
        for b, (row, n) in enumerate(zip(rows, counts, strict=True)):
            features[b, :n] = row.features
            tokens[b, :n] = torch.tensor(row.context[len(row.context) - n :])
            first = len(row.context) - 1 - n  # the position of the first waiting feature
            positions[b, :n] = torch.arange(first, first + n)
            valid[b, :n] = True
            row.features = row.features[:0]
        valid = valid.to(self.device)
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).tril()
        eye = torch.eye(width, dtype=torch.bool, device=self.device)
        among = (causal & valid[:, None, :]) | eye  # [B, n, n] a padding slot sees only itself
        allowed = torch.cat([kv.valid[:, None, :].expand(-1, width, -1), among], dim=2)  # [B, n, S+n]
        tokens, positions = tokens.to(self.device), positions.to(self.device)
        out = self.head(features, tokens, positions, allowed, kv.layers[0], self.weights)
        kv.append(valid)
        last = torch.tensor(counts, device=self.device) - 1
        return out[torch.arange(len(rows), device=self.device), last]

    def _log_confidence(self, features: torch.Tensor) -> torch.Tensor:
        """The head's next-token log-probabilities from (predicted) features over its draft vocabulary:
        [..., H] -> [..., N] (N = V without one; `head.to_target` maps an index to a token id)."""
        return torch.log_softmax(self.head.draft_logits(features).float(), dim=-1)

    def _grow(self, root: torch.Tensor, depth: int) -> Grown:
        """The tree below each row's pending token; the head's inputs for it are dropped afterwards."""
        kv, b = self.kv, len(self.rows)
        seen, slots = kv.valid, kv.num_slots  # [B, S] the slots of true features
        # Per row: the context position of the pending token (depth-d nodes sit at position + d).
        pending = torch.tensor([len(row.context) - 1 for row in self.rows], device=self.device)
        # Every node of a depth sits at one position per row: the rotary tables of depths 1..depth, made once.
        cos, sin = self.head.math.rope(pending[:, None] + torch.arange(depth, device=self.device), root.dtype)
        # The last frontier fed: its predicted features [B, F, H] and each node's drafted ancestors and
        # itself among the drafted slots [B, F, D].
        fed = {"features": root[:, None], "sees": torch.zeros(b, 1, 0, dtype=torch.bool, device=self.device)}

        def expand(tokens: torch.Tensor, parents: torch.Tensor, level: int) -> torch.Tensor:
            f = tokens.shape[1]
            parent = parents.clamp(min=0)  # the root is the only node of the "frontier" before level 1
            features = fed["features"].gather(1, parent[..., None].expand(-1, -1, root.shape[-1]))  # [B, F, H]
            ancestors = fed["sees"].gather(1, parent[..., None].expand(-1, -1, fed["sees"].shape[2]))  # [B, F, D]
            itself = torch.eye(f, dtype=torch.bool, device=self.device).expand(b, f, f)
            allowed = torch.cat([seen[:, None, :].expand(-1, f, -1), ancestors, itself], dim=2)
            rope = cos[:, :, level - 1 : level], sin[:, :, level - 1 : level]  # [B, 1, 1, hd]: every node of the level
            out = self.head(features, self.head.to_target(tokens), rope, allowed, kv.layers[0], self.weights)
            kv.append(torch.ones(b, f, dtype=torch.bool, device=self.device))
            fed["features"], fed["sees"] = out, torch.cat([ancestors, itself], dim=2)
            return self._log_confidence(out)

        try:
            if self.static_nodes:  # no deeper than the rows need: a shallower budget drafts that depth's shape
                shape = static_tree(self.static_nodes, depth, self.top_k)
                grown = grow_static(self._log_confidence(root), shape, expand)
            else:
                grown = grow(self._log_confidence(root), depth, self.top_k, expand)
        finally:
            kv.truncate(slots)
        grown.tokens = self.head.to_target(grown.tokens)  # the trees' tokens are indices into the draft vocabulary
        return grown


def _kept_features(states: TargetStates | None, row: int) -> torch.Tensor:
    """[n, H] the target's features at batch row `row`'s kept positions, a copy."""
    if states is None or states.hidden is None:
        raise ValueError("the EAGLE proposer drafts from the target's features: it needs them after every forward")
    return states.hidden[row, states.kept[row]].clone()
