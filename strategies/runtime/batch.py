"""A batch in decoding, which every strategy uses: one record per row (`Row`), the rows' shared state
(`Batch`), the prefill that starts it (`start_batch`), and plain autoregressive steps
(`decode_plainly`), the one implementation that the autoregressive strategy runs and that the
speculative loop runs whenever it does not draft.

Why one: a plain step of `auto` must cost what a step of the autoregressive strategy costs, on every
device. Between plain steps the chosen tokens stay on the device and the host syncs once per step
(to read them for the finish checks); a speculative loop that rebuilt its inputs from Python lists
every step would pay for that in host work, which is what bounds a small model's step on a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from strategies.base import GenerationParams, RowRequest, finish_reason
from strategies.constraints.grammars import RowMatcher
from strategies.constraints.masks import constrain
from strategies.runtime.cached_prefill import prefill
from strategies.runtime.kv_cache import RaggedKV
from strategies.runtime.logit_controls import next_token_logits
from strategies.runtime.logprobs import TokenLogprob, score_tokens
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import choose_tokens, greedy_tokens
from strategies.runtime.target_states import TargetStates

# Plain steps one `Decoding.step` takes at most: rows waiting to join a batch with room wait no longer.
PLAIN_RUN_STEPS = 8


@dataclass(eq=False)
class Row:
    """One request in decoding, from its prefill until its output is reported: every fact about the row
    is here, so that where the row goes (selected, joined, reported) its facts go with it, and no
    structure keeps them apart by position. A strategy that keeps more per row subclasses it
    (`start_batch`'s `row_type`)."""

    request: RowRequest
    number: int  # the request's number in its decoding: requests are numbered in the order they came
    tokens: list[int] = field(default_factory=list)  # generated, the pending one last
    reason: str | None = None  # why it finished; None while it goes on
    scores: list[TokenLogprob] | None = None  # each token's score, when `params.logprobs` asks for them
    # Where the row stands in its response_format's grammar, its emitted tokens followed; None: no format.
    matcher: RowMatcher | None = None


@dataclass
class Batch:
    """A batch in decoding: each unfinished row's newest token is pending (chosen, not yet in `kv`)."""

    params: GenerationParams
    kv: RaggedKV
    active: list[Row]  # batch row -> its record, unfinished rows only
    keys: torch.Tensor  # [len(active)] the active rows' sampling keys
    max_context: int  # the model's: a row ends when its next token would not fit
    # The target's states from its latest forward (prefill, verify or a run of plain steps), kept
    # only when a drafter reads them (`Proposer.wants_hidden_states`).
    states: TargetStates | None = None
    # Rows whose end `finished_rows` has not told, in request order; once told, the batch forgets a
    # row: a decoding that rows keep joining would otherwise hold every prompt and output it ever had.
    unreported: list[Row] = field(default_factory=list)
    count: int = 0  # requests this batch has had: the next to join is numbered `count`
    generated: int = 0  # tokens emitted since `take_generated` last ran

    @property
    def keeps_scores(self) -> bool:
        return self.params.logprobs is not None

    def emit(self, row: Row, token: int, score: TokenLogprob | None = None) -> bool:
        """Append `token` (with its `score` when the batch keeps scores) to a row's output; True when
        the row has finished with it."""
        tokens = row.tokens
        tokens.append(token)
        if row.matcher is not None:
            row.matcher.advance(token)
        self.generated += 1
        if row.scores is not None:
            row.scores.append(score)
        row.reason = finish_reason(row.request, tokens, self.params, self.max_context)
        return row.reason is not None

    def score(self, logits: torch.Tensor, tokens: torch.Tensor) -> list[TokenLogprob | None]:
        """Scores of `tokens` [N] chosen from `logits` [N, V], or Nones when the batch keeps none."""
        if not self.keeps_scores:
            return [None] * len(tokens)
        return score_tokens(logits, tokens, self.params.logprobs)

    def finished_rows(self) -> list[Row]:
        """Rows that finished since the last call, in request order; each is told once."""
        done = [row for row in self.unreported if row.reason is not None]
        if done:
            self.unreported = [row for row in self.unreported if row.reason is None]
        return done

    def take_generated(self) -> int:
        """Tokens emitted since the last call."""
        generated, self.generated = self.generated, 0
        return generated

    def admit(self, joining: Batch) -> None:
        """The rows of `joining` (a batch just started, `start_batch`) decode with this one's from now on:
        its requests are numbered after this batch's, its active rows follow this batch's. This batch
        must have active rows (one with none ends; the caller starts a new one instead)."""
        if not self.active:
            raise ValueError("rows cannot join a batch whose rows have all finished; start a new batch instead")
        for row in joining.unreported:  # a just-started batch has told nothing: these are all its rows
            row.number += self.count
        self.count += joining.count
        self.unreported += joining.unreported
        self.generated += joining.take_generated()
        if not joining.active:
            return
        self.kv.extend(joining.kv)
        self.keys = torch.cat([self.keys, joining.keys])
        self.active += joining.active
        if self.states is not None:
            self.states = self.states.join(joining.states)

    def keep(self, still: list[int]) -> None:
        """Only batch rows `still` (in order) go on: the cache and keys follow."""
        if len(still) == len(self.active):
            return
        if still:
            self.kv.select_rows(torch.tensor(still, dtype=torch.long, device=self.kv.valid.device))
        self.keys = self.keys[still]
        self.active = [self.active[b] for b in still]
        if self.states is not None and still:
            self.states = self.states.rows(still)


def start_batch(
    runner: ModelRunner,
    requests: list[RowRequest],
    params: GenerationParams,
    want_hidden: bool = False,
    row_type: type[Row] = Row,
) -> Batch:
    """Prefill the prompts and choose every row's first token; rows that end on it leave the batch.
    Each request gets a record of `row_type` (a strategy's subclass of `Row`, with its own defaults).

    Identical prompts (the samples of one input row) are prefilled once and their cache rows copied;
    prefixes the runner's prefix cache holds are not prefilled again (`cached_prefill`).
    """
    distinct: dict[tuple[int, ...], int] = {}
    source = [distinct.setdefault(tuple(r.prompt), len(distinct)) for r in requests]  # request -> prompt
    kv = runner.new_kv(len(distinct))
    out = prefill(runner, kv, [list(p) for p in distinct], want_hidden=want_hidden)
    last, hidden = out.logits[:, -1], out.hidden  # [P, V], [P, L, H] per distinct prompt
    if len(distinct) < len(requests):
        index = torch.tensor(source, dtype=torch.long, device=kv.valid.device)
        kv.select_rows(index)
        last, hidden = last[index], hidden[index] if want_hidden else None
    keys = torch.tensor([r.key for r in requests], dtype=torch.long)  # [B]
    scored = params.logprobs is not None
    rows = [
        row_type(r, number, scores=[] if scored else None, matcher=None if r.grammar is None else r.grammar.matcher())
        for number, r in enumerate(requests)
    ]
    ruled = ruled_logits(last, [row.matcher for row in rows], requests, [[] for _ in requests], params)
    first = choose_tokens(ruled, params.sampling, keys, torch.zeros(len(requests), dtype=torch.long))
    batch = Batch(params, kv, rows, keys, runner.max_context, unreported=list(rows), count=len(rows))
    if want_hidden:
        width = hidden.shape[1]  # prompts are left-padded: row b's prompt fills its last slots
        batch.states = TargetStates(hidden, [list(range(width - len(r.prompt), width)) for r in requests])
    scores = batch.score(last, first)
    tokens = first.tolist()
    batch.keep([b for b, row in enumerate(rows) if not batch.emit(row, tokens[b], scores[b])])
    return batch


def ruled_logits(
    logits: torch.Tensor,
    matchers: Sequence[RowMatcher | None],
    requests: Sequence[RowRequest],
    outputs: Sequence[Sequence[int]],
    params: GenerationParams,
) -> torch.Tensor:
    """[B, V] each row's next-token logits inside its grammar and under its controls (row b's output so
    far: `outputs[b]`; a batch with neither pays nothing). Sampling: the grammar's mask first, so the
    controls act on allowed tokens only (min_p's top one among them). Greedy: the controls first (at
    temperature 0 each is pointwise and leaves -inf at -inf, so the order changes no allowed token's
    logit), then a row is masked only where its grammar refuses its argmax (`masks.needs_mask`)."""
    if not params.sampling.greedy:
        return next_token_logits(constrain(logits, matchers), requests, outputs, params)
    controlled = next_token_logits(logits, requests, outputs, params)
    if all(m is None for m in matchers):
        return controlled
    return constrain(controlled, matchers, greedy_tokens(controlled).tolist())


@dataclass
class PlainRun:
    """What a run of plain steps did, for the caller's bookkeeping."""

    rows: list[int] = field(default_factory=list)  # per step: rows it decoded
    seconds: list[float] = field(default_factory=list)  # per step: wall time
    emitted: list[list[int]] = field(default_factory=list)  # per row at the start: tokens it gained
    still: list[int] = field(default_factory=list)  # rows at the start that go on

    @property
    def steps(self) -> int:
        return len(self.rows)


def decode_plainly(runner: ModelRunner, batch: Batch, max_steps: int | None = None) -> PlainRun:
    """Plain steps for the batch's active rows: until `max_steps`, or until a step after which a row
    has finished (the batch's size changes there, and a caller that chooses per batch size chooses
    again). Finished rows are not dropped: `run.still` says which rows go on (`Batch.keep`)."""
    params, active = batch.params, batch.active
    device = runner.device
    want_hidden = batch.states is not None
    hidden: list[torch.Tensor] = []  # per step: [B, H] when the batch keeps the target's states
    pending = torch.tensor([row.tokens[-1] for row in active], dtype=torch.long, device=device)  # [B]
    run = PlainRun(emitted=[[] for _ in active], still=list(range(len(active))))
    # Each row's controls read its output so far: its token list, which `emit` extends in place.
    requests, outputs = [row.request for row in active], [row.tokens for row in active]
    matchers = [row.matcher for row in active]
    while max_steps is None or run.steps < max_steps:
        began = time.perf_counter()
        ids = pending[:, None]  # [B, 1]
        out = runner.forward(
            batch.kv, ids, batch.kv.next_pos[:, None], torch.ones_like(ids, dtype=torch.bool), want_hidden=want_hidden
        )
        if want_hidden:
            hidden.append(out.hidden[:, -1])
        # Generation index of each row's next token: keys a sampled draw (greedy needs none).
        positions = None if params.sampling.greedy else torch.tensor([len(row.tokens) for row in active])
        ruled = ruled_logits(out.logits[:, -1], matchers, requests, outputs, params)
        pending = choose_tokens(ruled, params.sampling, batch.keys, positions)  # [B]
        scores = batch.score(out.logits[:, -1], pending)
        finished = False
        for b, (row, token) in enumerate(zip(active, pending.tolist(), strict=True)):
            run.emitted[b].append(token)
            finished |= batch.emit(row, token, scores[b])
        run.rows.append(len(active))
        run.seconds.append(time.perf_counter() - began)
        if finished:
            run.still = [b for b, row in enumerate(active) if row.reason is None]
            break
    if hidden:
        batch.states = TargetStates(torch.stack(hidden, dim=1), [list(range(len(hidden)))] * len(active))
    return run
