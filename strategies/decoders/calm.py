"""Confident adaptive language modelling (CALM, Schuster et al. 2022): each token stops at the first
layer whose exit is confident enough. Lossy: a token may be an intermediate layer's guess.

A decode step feeds every row's pending token through the target layer by layer (`LayerPass`).
After each layer that has an exit (`exits.ExitHeads`, at or after `min_layer`), every row still
going deeper measures its confidence there:

- `softmax`: the exit's largest probability;
- `gap`: the difference between its two largest probabilities;
- `state`: hidden-state saturation, the cosine between the states before and after the layer;
- `classifier`: the exit's trained classifier, P(this layer's argmax is the final layer's).

A row exits when its confidence reaches λ_t = λ·(0.9 + 0.1·exp(−τ·t/N)) (t: the token's index in
the row's output, N: `max_new_tokens`; τ = 0: a constant λ); its token is the exit head's choice
there. Rows that never pass take the target's own last layer.

Rows of one batch exit at different layers (`batch_exit=row`). A row that exited keeps its exit
state through the layers it skips (state propagation): each skipped layer still projects its keys
and values from that state, so later tokens find every layer's slots filled, but runs neither its
output projection nor its MLP (the larger part of a layer) for it; attention still runs for every row
while any goes deeper (gathering the deeper rows' cache would copy more than a query costs). So a
batch spends in layer l roughly what its rows still there need, and once every row has exited, the
remaining layers only project keys and values: one slow row costs the batch its own depth, not the
batch's. The rows' tokens then come from one LM head over their exit states (the target's, shared
by the exits), however many layers they left at (softmax and gap: from the logits their measure
already computed). The reference's rule (`batch_exit=batch`: the
batch exits only when every row passes, the slowest row sets the depth) is there to compare.

Each row's mean exit layer (its first token, chosen by the prefill, counts at full depth) is in its
output (the `mean_exit_layer` column it declares); the batch's, in its statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from strategies.artifacts.exits import ExitHeads
from strategies.base import BatchOutput, GenerationParams, RowOutput, RowRequest, Segment, decode_to_end
from strategies.runtime.batch import Batch, Row, start_batch
from strategies.runtime.linear import linear
from strategies.runtime.logit_controls import next_token_logits
from strategies.runtime.runner import LayerPass, ModelRunner
from strategies.runtime.sampling import choose_tokens

DECAY_FLOOR = 0.9  # λ_t never falls below this share of λ


def threshold_at(threshold: float, tau: float, index: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """CALM's decaying threshold λ_t for generation indices `index` [B] -> [B] float64."""
    return threshold * (DECAY_FLOOR + (1 - DECAY_FLOOR) * torch.exp(-tau * index.double() / max_new_tokens))


def never_exiting_threshold(tau: float) -> float:
    """The least λ that never exits, whatever `max_new_tokens`: every measure's confidence is at most 1
    (and can be exactly 1), and λ_t > λ·(0.9 + 0.1·exp(−τ)) for every token (t < N)."""
    return 1 / (DECAY_FLOOR + (1 - DECAY_FLOOR) * math.exp(-tau))


class CalmSettings(Protocol):
    """What it reads of `strategy.calm` (`strategies.methods.calm.CalmOptions`, which checks them)."""

    threshold: float
    measure: str
    decay_tau: float
    min_layer: int
    batch_exit: str


class CalmStrategy:
    """Early exit per row and per token; skipped layers' keys and values filled by state propagation."""

    name = "calm"

    def __init__(self, runner: ModelRunner, exits: ExitHeads, options: CalmSettings) -> None:
        runner.need_layers()
        if options.measure == "classifier" and not exits.has_classifier:
            raise ValueError(
                "strategy.calm.measure=classifier needs exits trained with their confidence classifier "
                "(accelgen train exits exits.classifier=true); or use softmax, gap or state"
            )
        self.runner = runner
        self.exits = exits
        self.options = options
        self.layers = [layer for layer in exits.layers if layer >= options.min_layer]

    def open(self, requests: list[RowRequest], params: GenerationParams) -> CalmDecoding:
        if params.logprobs is not None:
            raise ValueError(
                "strategy calm never runs the target's full forward for the tokens it chooses at intermediate "
                "layers, so it has no target log-probabilities to report"
            )
        return CalmDecoding(self, start_batch(self.runner, requests, params, row_type=_CalmRow))

    def generate(self, requests: list[RowRequest], params: GenerationParams) -> BatchOutput:
        return decode_to_end(self.name, self.open(requests, params), len(requests))

    @torch.inference_mode()
    def _step(self, batch: Batch) -> tuple[list[int], list[int]]:
        """One token per active row: (tokens, the layer each exited after).

        Rows that exit, and rows that reach the last layer, wait for one LM head at the end of the step
        (exits share the target's): rows leaving at three layers would otherwise pay three, and on a
        small model the LM head costs more than a layer. Only the softmax and gap measures need an
        exit's logits when it is reached, and their rows' tokens are chosen from those.
        """
        runner, kv, params = self.runner, batch.kv, batch.params
        device = runner.device
        b, num_layers = len(batch.active), runner.num_layers
        pending = torch.tensor([row.tokens[-1] for row in batch.active], dtype=torch.long, device=device)
        index = torch.tensor([len(row.tokens) for row in batch.active], dtype=torch.long)  # [B]
        passes_at = threshold_at(self.options.threshold, self.options.decay_tau, index, params.max_new_tokens)
        fed = torch.ones(b, 1, dtype=torch.bool, device=device)
        step = runner.layer_pass(kv, pending[:, None], kv.next_pos[:, None], fed)
        going = torch.arange(b, device=device)  # rows still going deeper
        depth = torch.full((b,), num_layers, dtype=torch.long)
        chosen = torch.zeros(b, dtype=torch.long, device=device)
        states = torch.zeros_like(step.x[:, -1])  # [B, D] what the LM head reads, per waiting row
        waiting = []  # rows whose token comes from the step's one LM head
        for layer in self.layers:
            if going.numel() == 0:
                break
            before = None  # [G, D] the state entering the layer: the state measure's
            if self.options.measure == "state":
                before = self._run(step, layer - 1, going, b)[going, -1]
            after = self._run(step, layer, going, b)[going, -1]  # [G, D]
            confidence, logits, exit_states = self._confidence(layer, before, after)  # [G], [G, V], [G, D]
            passed = confidence.double().cpu() >= passes_at[going.cpu()]  # [G]
            if self.options.batch_exit == "batch":
                passed = passed if bool(passed.all()) else torch.zeros_like(passed)
            if not bool(passed.any()):
                continue
            here = passed.to(device)
            leaving = going[here]
            if logits is not None:
                keys, where = batch.keys[leaving.cpu()], index[leaving.cpu()]
                controlled = self._controlled(batch, logits[here], leaving)
                chosen[leaving] = choose_tokens(controlled, params.sampling, keys, where)
            elif exit_states is None:  # the state measure: only the leaving rows need their exit's state
                states[leaving] = self.exits.exit(layer).state(after[here])
                waiting.append(leaving)
            else:
                states[leaving] = exit_states[here]
                waiting.append(leaving)
            depth[leaving.cpu()] = layer
            going = going[~here]
        self._run(step, num_layers, going, b)
        if going.numel():
            states[going] = step.final_state(None if going.numel() == b else going)[:, -1]
            waiting.append(going)
        if waiting:
            rows = torch.cat(waiting)
            logits = linear(states[rows], self.exits.lm_head)  # [W, V]
            controlled = self._controlled(batch, logits, rows)
            chosen[rows] = choose_tokens(controlled, params.sampling, batch.keys[rows.cpu()], index[rows.cpu()])
        step.finish()
        return chosen.tolist(), depth.tolist()

    @staticmethod
    def _controlled(batch: Batch, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """`logits` [G, V] of batch rows `rows` under those rows' controls (penalties and the like)."""
        if all(row.request.controls is None for row in batch.active):
            return logits  # without reading `rows` back from the device
        active = [batch.active[b] for b in rows.tolist()]
        return next_token_logits(logits, [r.request for r in active], [r.tokens for r in active], batch.params)

    @staticmethod
    def _run(step: LayerPass, end: int, going: torch.Tensor, batch_size: int) -> torch.Tensor:
        """Layers up to `end`; rows outside `going` propagate their state (None: every row goes on)."""
        return step.run(end, None if going.numel() == batch_size else going)

    def _confidence(
        self, layer: int, before: torch.Tensor | None, after: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Each row's confidence at `layer` [G], and what the measure computed on the way: the exit's
        logits [G, V] (softmax, gap) or the exit's state [G, D] (classifier), else None."""
        measure = self.options.measure
        if measure == "state":
            return F.cosine_similarity(before.double(), after.double(), dim=-1), None, None
        module = self.exits.exit(layer)
        state = module.state(after)  # [G, D]
        if measure == "classifier":
            return module.confidence(state), None, state
        logits = linear(state, self.exits.lm_head)  # [G, V]
        top = logits.double().softmax(dim=-1).topk(2, dim=-1).values  # [G, 2]
        return (top[:, 0] if measure == "softmax" else top[:, 0] - top[:, 1]), logits, None


@dataclass(eq=False)
class _CalmRow(Row):
    """A batch's row, and the layers its decoded tokens exited after (the prefill's first token, at
    full depth, is not among them)."""

    exit_layers: float = 0.0


class CalmDecoding:
    """A batch in early-exit decoding (`base.Decoding`): one token per row a step."""

    def __init__(self, strategy: CalmStrategy, batch: Batch) -> None:
        self.strategy = strategy
        self.batch = batch
        self.full = float(strategy.runner.num_layers)
        self.steps = 0  # since the last segment
        self.segment_depth = self.full * batch.count  # layers of the tokens since the last segment

    def active(self) -> int:
        return len(self.batch.active)

    def step(self) -> None:
        batch = self.batch
        tokens, depths = self.strategy._step(batch)
        self.steps += 1
        still = []
        for b, (row, token, depth) in enumerate(zip(batch.active, tokens, depths, strict=True)):
            row.exit_layers += depth
            self.segment_depth += depth
            if not batch.emit(row, token):
                still.append(b)
        batch.keep(still)

    def admit(self, requests: list[RowRequest]) -> None:
        self.batch.admit(start_batch(self.strategy.runner, requests, self.batch.params, row_type=_CalmRow))
        self.segment_depth += self.full * len(requests)

    def finished(self) -> list[tuple[int, RowOutput]]:
        done = []
        for row in self.batch.finished_rows():
            mean = round((self.full + row.exit_layers) / max(1, len(row.tokens)), 3)
            done.append((row.number, RowOutput(row.tokens, row.reason, columns={"mean_exit_layer": mean})))
        return done

    def segment(self) -> Segment:
        generated = self.batch.take_generated()
        layers = self.strategy.runner.num_layers
        stats = {"mean_exit_layer": round(self.segment_depth / max(1, generated), 3), "num_layers": layers}
        steps, self.steps, self.segment_depth = self.steps, 0, 0.0
        return Segment(steps, generated, stats)
