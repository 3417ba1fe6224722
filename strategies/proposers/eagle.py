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
(`eagle_tree.grow`, reranked to the node budget: at temperature 0 grown and reranked on chances of
acceptance calibrated on the verifier's verdicts, `eagle_tree.Calibration`; above it by the paper's
rule) or EAGLE-1's static shape (`eagle_tree.static_tree`, grown by `eagle_tree.grow_static`, cut to
the budget by `eagle_tree.first_nodes`). Drafted inputs are made of predicted features, so they are
dropped from the cache as soon as the draft is built: once the target has verified, its true features
for the accepted positions take their place. The cache after a step is thus exactly what a fresh head
would hold over the accepted tokens.

A head started after its batch (a controller turned it on late) has only the features of the
target's forwards from then on: its drafts are still verified exactly, only guessed with less context.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn.utils.rnn import pad_sequence

from strategies.artifacts.eagle import EagleHead
from strategies.base import GenerationParams
from strategies.proposers.eagle_tree import (
    Calibration,
    Grown,
    Offered,
    calibrated_values,
    drafts_of,
    first_nodes,
    grow,
    grow_static,
    offered_nodes,
    ranked_nodes,
    static_tree,
    verdicts,
)
from strategies.runtime import linear
from strategies.runtime.kv_cache import RaggedKV
from strategies.runtime.llama_forward import LayerWeights
from strategies.runtime.runner import square_masks
from strategies.runtime.target_states import TargetStates
from strategies.verification.drafts import Draft
from strategies.verification.proposer import ProposalContext, Proposer


@dataclass
class _EagleRow:
    context: list[int]  # prompt and generated tokens, the pending one last
    # [n, H] the target's features not fed to the head yet: those of the n positions before the pending
    # token (the last chose it); each is fed with the token after it.
    features: torch.Tensor
    # Features of the steps since, joined to `features` when the head is fed: a head started with its
    # batch and not planned for a while would otherwise copy its whole backlog at every plain step.
    later: list[torch.Tensor] = field(default_factory=list)


class EagleProposer(Proposer[_EagleRow]):
    """One record per row, and the head's cache of every row (`kv`, rows in the records' order)."""

    name = "eagle"
    wants_hidden_states = True
    drafts_per_depth = True

    def __init__(self, head: EagleHead, top_k: int, static_nodes: int = 0) -> None:
        self.head = head
        self.top_k = top_k  # children per expanded node, and nodes expanded per level; 1: a chain
        self.static_nodes = static_nodes  # > 0: EAGLE-1's static tree of that many nodes, ranks below top_k
        self._fused: tuple[tuple[int, ...], LayerWeights] | None = None  # parameter versions, fused weights
        # The dynamic tree's ranking at temperature 0, learned from every verdict on its drafts (`verdicts`).
        self.calibration = Calibration()
        self._offered: list[list[Offered]] | None = None  # per row, the last draft's nodes until judged
        self.weights = self._fused_weights()  # as its strategy is made, before decoding

    @property
    def device(self) -> torch.device:
        return self.head.fc.weight.device

    def _fused_weights(self) -> LayerWeights:
        """The head's layer weights fused (`EagleHead.layer_weights`), fused again only when a parameter
        has changed since (a training step updates them in place), with their packed copies made now
        (`linear.prepack`). Fused anew for every batch, they were new tensors that `linear` packed again
        at the batch's first draft: at batch 1, at every prompt. Packed at the first batch's start, they
        would cost several plain steps, charged to the step the controller explores EAGLE with."""
        versions = tuple(0 if p.is_inference() else p._version for p in self.head.parameters())
        if self._fused is None or self._fused[0] != versions:
            with torch.no_grad():
                weights = self.head.layer_weights()
            linear.prepack([weights.w_qkv, weights.w_o, weights.w_gate_up, weights.w_down, self.head.fc.weight])
            if self.head.draft_lm_head is not None:
                linear.prepack([self.head.draft_lm_head])
            self._fused = (versions, weights)
        return self._fused[1]

    def start(self, contexts: list[list[int]], params: GenerationParams, states: TargetStates | None) -> None:
        super().start(contexts, params, states)
        self.weights = self._fused_weights()
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
        self._offered = None
        if rows:
            self.kv.select_rows(torch.tensor(rows, dtype=torch.long, device=self.device))

    def emitted(self, emitted: list[list[int]], states: TargetStates | None) -> None:
        for b, (row, tokens) in enumerate(zip(self.rows, emitted, strict=True)):
            row.context.extend(tokens)
            row.later.append(_kept_features(states, b))
        if self._offered is not None:  # the verdicts on the last dynamic tree, at temperature 0
            for offered, tokens in zip(self._offered, emitted, strict=True):
                for depth, rank, confidence, accepted in verdicts(offered, tokens):
                    self.calibration.record(depth, rank, confidence, accepted)
            self._offered = None

    @torch.inference_mode()
    def propose(self, context: ProposalContext) -> list[Draft]:
        root = self._feed_target_features()  # [B, H] the predicted feature below each pending token
        # A node is kept with all its ancestors, so none deeper than the node budget is: levels below it
        # would be head passes for nothing (a controller that sizes a tree to 2 nodes at batch 8).
        depth = min(max(context.budgets), context.max_nodes)
        grown = self._grow(root, depth, context.max_nodes) if depth else None
        self.kv.compact_if_wasteful()
        if grown is None:
            return [Draft.empty() for _ in context.budgets]
        if self.static_nodes:
            return first_nodes(grown, context.budgets, context.max_nodes)
        if not self.params.sampling.greedy:  # the paper's rule: what the target samples is another matter
            return drafts_of(grown, ranked_nodes(grown, context.budgets, context.max_nodes))
        # At temperature 0 on calibrated chances of acceptance (`Calibration`), learned from the verdicts.
        kept = ranked_nodes(grown, context.budgets, context.max_nodes, calibrated_values(grown, self.calibration))
        self._offered = offered_nodes(grown, kept)
        return drafts_of(grown, kept)

    def _feed_target_features(self) -> torch.Tensor:
        """Feed every row's waiting (true feature, next token) pairs to the head's cache: [B, H], per
        row the predicted feature of the pending token's position. Where every row waits with as many
        (batch 1 always), nothing is padded or masked between them."""
        rows, kv, device = self.rows, self.kv, self.device
        for row in rows:
            if row.later:
                row.features, row.later = torch.cat([row.features, *row.later]), []
        counts = [len(row.features) for row in rows]
        width = max(counts)
        ragged = min(counts) < width
        # [B, n, H]; ragged: zeros past a row's own
        features = pad_sequence([row.features for row in rows], batch_first=True) if ragged else None
        if features is None:
            features = rows[0].features[None] if len(rows) == 1 else torch.stack([row.features for row in rows])
        # Per row, the tokens after its waiting features (the pending one last), and the position of the
        # first; a padding slot takes the positions after its row's, which no slot ever sees.
        tokens = [row.context[len(row.context) - n :] + [0] * (width - n) for row, n in zip(rows, counts, strict=True)]
        first = torch.tensor([len(row.context) - 1 - n for row, n in zip(rows, counts, strict=True)], device=device)
        for row in rows:
            row.features = row.features[:0]
        causal, eye = square_masks(width, device)
        if ragged:
            count = torch.tensor(counts, device=device)
            valid = torch.arange(width, device=device) < count[:, None]  # [B, n]
            among = (causal & valid[:, None, :]) | eye  # [B, n, n] a padding slot sees only itself
        else:
            valid = torch.ones(len(rows), width, dtype=torch.bool, device=device)
            among = causal.expand(len(rows), width, width)
        allowed = torch.cat([kv.valid[:, None, :].expand(-1, width, -1), among], dim=2)  # [B, n, S+n]
        positions = first[:, None] + torch.arange(width, device=device)  # [B, n]
        tokens_t = torch.tensor(tokens, device=device)
        out = self.head(features, tokens_t, positions, allowed, kv.layers[0], self.weights)
        kv.append(valid)
        if not ragged:
            return out[:, -1]
        return out[torch.arange(len(rows), device=device), count - 1]

    def _log_confidence(self, features: torch.Tensor) -> torch.Tensor:
        """The head's next-token log-probabilities from (predicted) features over its draft vocabulary:
        [..., H] -> [..., N] (N = V without one; `head.to_target` maps an index to a token id)."""
        return torch.log_softmax(self.head.draft_logits(features).float(), dim=-1)

    def _grow(self, root: torch.Tensor, depth: int, nodes: int) -> Grown:
        """The tree below each row's pending token, of which at most `nodes` will be kept; the head's
        inputs for it are dropped afterwards.

        A static tree grows only the first `nodes` nodes of its shape, the ones `first_nodes` keeps where
        every row may draft `depth` deep (a row allowed less, near its end, keeps those of them that fit):
        the shape's later nodes cost head passes at depths the budget never reaches. The dynamic tree
        grows whole: which of its nodes are kept depends on their confidences.

        A depth's nodes are written to the head's cache layer only, never recorded as slots
        (`RaggedKV.append`): each node's mask names what it sees, and `truncate` drops them all."""
        kv, head, device = self.kv, self.head, self.device
        slots = kv.num_slots
        # Per row: the context position of the pending token (depth-d nodes sit at position + d).
        pending = torch.tensor([len(row.context) - 1 for row in self.rows], device=device)
        # Every node of a depth sits at one position per row: the rotary tables of depths 1..depth, made once.
        cos, sin = head.math.rope(pending[:, None] + torch.arange(depth, device=device), root.dtype)
        # The last frontier fed: its predicted features [B, F, H] and what each node saw [B, F, S + D]: the
        # slots of true features, its drafted ancestors and itself.
        fed = {"features": root[:, None], "sees": kv.valid[:, None, :]}

        def expand(tokens: torch.Tensor, parents: torch.Tensor, level: int) -> torch.Tensor:
            f = tokens.shape[1]
            parent = parents.clamp(min=0)[..., None]  # [B, F, 1] the root is the only node before level 1
            features = fed["features"].gather(1, parent.expand(-1, -1, root.shape[-1]))  # [B, F, H]
            ancestors = fed["sees"].gather(1, parent.expand(-1, -1, fed["sees"].shape[2]))  # [B, F, S + D]
            allowed = torch.cat([ancestors, square_masks(f, device)[1].expand(len(tokens), f, f)], dim=2)
            rope = cos[:, :, level - 1 : level], sin[:, :, level - 1 : level]  # [B, 1, 1, hd]: every node of the level
            out = head(features, head.to_target(tokens), rope, allowed, kv.layers[0], self.weights)
            fed["features"], fed["sees"] = out, allowed
            return self._log_confidence(out)

        try:
            if self.static_nodes:  # no deeper than the rows need: a shallower budget drafts that depth's shape
                shape = static_tree(min(self.static_nodes, nodes), depth, self.top_k)
                grown = grow_static(self._log_confidence(root), shape, expand)
            else:  # a frontier wider than the nodes kept costs head work for nodes never verified
                score = self.calibration.score if self.params.sampling.greedy else None
                grown = grow(self._log_confidence(root), depth, min(self.top_k, nodes), expand, score=score, keep=nodes)
        finally:
            kv.truncate(slots)
        grown.tokens = head.to_target(grown.tokens)  # the trees' tokens are indices into the draft vocabulary
        return grown


def _kept_features(states: TargetStates | None, row: int) -> torch.Tensor:
    """[n, H] the target's features at batch row `row`'s kept positions, a copy."""
    if states is None or states.hidden is None:
        raise ValueError("the EAGLE proposer drafts from the target's features: it needs them after every forward")
    return states.hidden[row, states.kept[row]].clone()
