"""The verifier: one target forward checks every row's draft, and an acceptance rule decides.

Every drafting strategy verifies through `verify`, whatever drafted (a draft model, the row's own
context, a trie, heads on the target's states): the drafter brings drafts and the rule it was
built with (`acceptance`), the verifier brings the forward, the cache and the bookkeeping.

Inputs (`verify_inputs`): per row `[pending, node_0, …, node_{N-1}]`, right-padded to the widest
row. Slot 0 is the pending token, slot i+1 node i, at position `next_pos + depth` (`tree_depths`);
each slot sees the row's cache, its ancestors and itself (`tree_attention`; chains need no mask).
After the rule picks each row's path, each row's kept slots move to the front of the step's block
and the block is cut to the longest row's (`kv_cache.RaggedKV.keep_paths`), so rows of one forward keep
different numbers of tokens and no row leaves dead slots behind it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from strategies.runtime.kv_cache import RaggedKV
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from strategies.runtime.target_states import TargetStates
from strategies.verification.acceptance import Slots, Verdict, accept
from strategies.verification.draft_controls import DraftControls
from strategies.verification.drafts import Draft, is_chain, tree_attention, tree_depths
from strategies.verification.rules import AcceptanceRule


@dataclass
class VerifyInputs:
    ids: torch.Tensor  # [B, W] pending token then draft nodes, 0-padded
    positions: torch.Tensor  # [B, W] next_pos + depth
    valid: torch.Tensor  # [B, W] bool: False for padding
    attend: torch.Tensor | None  # [B, W, W] tree ancestry; None when every draft is a chain
    depths: torch.Tensor  # [B, W] on the CPU: each slot's depth below the pending token (padding: 0)


@dataclass
class Verification:
    """What one verify forward decided, per row."""

    verdicts: list[Verdict]
    # The target's states at [pending, nodes…], kept: [0, *accepted_slots], when hidden states or
    # logits are asked for (`hidden` None unless asked).
    states: TargetStates | None
    logits: torch.Tensor  # [B, W, V] the target's logits at every slot
    forward_s: float  # the forward and the rule, until its verdicts were on the host (the controller's cost model)
    # New tokens per row the forward computed: its grid's width, or, where it left padding out of its
    # matmuls, the width of a full grid computing as many slots (rounded up). What its time is the cost of.
    computed_width: int

    def emitting_logits(self) -> torch.Tensor:
        """[M, V]: the logits at the slot that chose each emitted token, row after row. Token j of a
        row's verdict was chosen at slot j of [0, *accepted_slots]: the pending token's, then each accepted node's."""
        rows = [row for row, v in enumerate(self.verdicts) for _ in v.tokens]
        slots = [slot for v in self.verdicts for slot in [0, *v.accepted_slots]]
        return self.logits[rows, slots]


def verify_inputs(pending: list[int], drafts: list[Draft], next_pos: torch.Tensor) -> VerifyInputs:
    """The verify forward's inputs on `next_pos`'s device. Built as Python lists and turned into tensors
    once: per-row tensor writes cost more than the forward's own launches on a GPU at small batch."""
    device = next_pos.device
    width = 1 + max(len(d) for d in drafts)
    ids, depth, valid = [], [], []
    for token, draft in zip(pending, drafts, strict=True):
        pad = [0] * (width - 1 - len(draft))
        ids.append([token, *draft.tokens, *pad])
        depth.append([*tree_depths(draft.parents), *pad])
        valid.append([True] * (1 + len(draft)) + [False] * len(pad))
    chains = all(is_chain(d) for d in drafts)
    attend = None if chains else torch.stack([tree_attention(d.parents, width) for d in drafts]).to(device)
    depths = torch.tensor(depth, dtype=torch.long)  # [B, W]
    return VerifyInputs(
        ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=next_pos[:, None] + depths.to(device),
        valid=torch.tensor(valid, device=device),
        attend=attend,
        depths=depths,
    )


def verify(
    runner: ModelRunner,
    kv: RaggedKV,
    pending: list[int],
    drafts: list[Draft],
    rule: AcceptanceRule,
    sampling: SamplingParams,
    keys: torch.Tensor,  # [B] the rows' sampling keys
    generated: list[int],  # per row: tokens generated so far, the pending one included
    want_hidden: bool = False,
    want_logits: bool = False,
    controls: DraftControls | None = None,
) -> Verification:
    """Run the target over every row's draft, apply `rule`, and roll the rejected slots back.

    On an exception (a CUDA out-of-memory error in the forward, a rule refusing a draft) every row's
    cache is exactly as before the call, and the exception propagates. The rule sees the logits under
    the rows' `controls` (penalties and the like, at every slot); the scores and the states keep the
    target's own.
    """
    first_slot = kv.num_slots
    began = time.perf_counter()
    inputs = verify_inputs(pending, drafts, kv.next_pos)
    out = runner.forward(kv, inputs.ids, inputs.positions, inputs.valid, inputs.attend, want_hidden=want_hidden)
    try:
        # The token chosen at a slot is generation index `generated + depth` of its row.
        slots = Slots(sampling.seed, keys, torch.tensor(generated, dtype=torch.long)[:, None] + inputs.depths)
        ruled = out.logits if controls is None else controls.apply(out.logits, drafts)
        verdicts = accept(rule, ruled, drafts, slots, sampling)
        forward_s = time.perf_counter() - began
    except BaseException:
        kv.invalidate(inputs.valid, first=first_slot)
        raise
    kept = [[0, *v.accepted_slots] for v in verdicts]
    width = inputs.ids.shape[1]
    kv.keep_paths(first_slot, kept)
    kv.compact_if_wasteful()
    states = TargetStates(out.hidden, kept, out.logits) if want_hidden or want_logits else None
    computed_width = width if out.computed is None else -(-out.computed // len(drafts))
    return Verification(verdicts, states, out.logits, forward_s, computed_width)
