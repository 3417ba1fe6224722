"""The proposer contract: drafts below each row's pending token, told afterwards what was emitted.

A proposer never touches the target model or its cache. The speculative loop asks it for one
`Draft` per row, verifies all rows in one target forward (`strategies.verification.verify`), and reports each
row's emitted tokens (accepted draft tokens, then the target's token, which becomes the next
pending token). A proposer that raises, or returns a draft that fails `drafts.draft_problem`,
costs that step its speed-up, never a row: the rows concerned take one ordinary autoregressive step.

Each proposer keeps one record per row (`Proposer.rows`), made, extended and selected by the base
class as rows start, join and finish; the loop drives all three from its one row-selection step.

A proposer that drafts from the target's own states (draft heads) says so (`wants_hidden_states`)
and receives, at its start and after every step, what the target computed for each row in the
forward just taken: prefill, verify and plain steps alike (`TargetStates`). One that reads the
target's logits at every slot of a verify forward (Jacobi's next iterate) says `wants_verify_logits`
and receives them without the hidden states. Proposers that do not ask never pay for either.

The one exception to "never touches the target's cache": a proposer that drafts with the target's
own first layers (`self_speculative`) sets `shares_cache = True` and is handed the batch's cache
(`use_cache(kv)`) before `start`. It only adds provisional columns (`kv_cache.Provisional`), which
the next target forward reuses or drops, so the cache's slots stay the loop's alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

import torch

from strategies.base import GenerationParams
from strategies.runtime.kv_cache import RaggedKV
from strategies.runtime.target_states import TargetStates
from strategies.verification.drafts import Draft

RowState = TypeVar("RowState")


@dataclass
class ProposalContext:
    num_generated: list[int]  # per row: how many tokens it has generated so far, the pending one included
    budgets: list[int]  # per row: deepest useful draft path (0: no draft for this row)
    max_nodes: int  # most draft nodes per row (trees)
    keys: torch.Tensor  # [B] the rows' sampling keys (the batch's: a proposer keeps no copy to keep in step)
    # The target's states from its latest forward, for a proposer that wants hidden states, else None.
    states: TargetStates | None = None
    # For a proposer that sizes its own drafts: what a step drafting k = 1, 2, ... tokens costs, in plain
    # steps, by the controller's cost model; None: it has none yet (the proposer's own defaults).
    step_costs: list[float] | None = None


class Proposer(Generic[RowState]):
    """A proposer: one `RowState` record per batch row, in batch order (`rows`).

    Adding and dropping rows is done here, once: `start` and `add_rows` make a record per row
    (`new_row_state`), `keep_rows` keeps the records of the rows that go on. A proposer that keeps
    batched tensors as well (a draft cache) extends and selects them in its overrides of these, by the
    same rows; what only the batch owns (sampling keys, the target's states) it reads from the
    `ProposalContext` instead of keeping a copy.

    What a proposer asks of the target is declared on its class, so the loop computes only that:
    `wants_hidden_states` (draft heads), `wants_verify_logits` (Jacobi's next iterate) and
    `shares_cache` (self-speculation drafts in the target's own cache); and what its drafts cost,
    `drafts_per_depth`, to the controller.
    """

    name: str
    wants_hidden_states: ClassVar[bool] = False  # `start`, `add_rows` and `emitted` receive the hidden states
    wants_verify_logits: ClassVar[bool] = False  # `emitted` receives a verify forward's logits
    shares_cache: ClassVar[bool] = False  # handed the batch's cache (`use_cache`) before `start`
    # Its drafting runs a model once per draft depth (a draft model, EAGLE's head): a shorter draft
    # costs it less, which the controller's cost model assumes until it has measured (`DraftLimits`).
    drafts_per_depth: ClassVar[bool] = False
    # It cuts the batch's drafts to the depth they are worth (`draft_sizing`), within the depth asked:
    # the controller asks for its longest and says what each depth costs instead.
    sizes_own_drafts: bool = False
    # Seconds of its last `propose` spent on work done once per row, as `start`'s is (Lookahead counts a
    # row's prompt at the row's first proposal): left out of the step's time the controller measures.
    setup_s: float = 0.0
    params: GenerationParams
    rows: list[RowState]

    def start(self, contexts: list[list[int]], params: GenerationParams, states: TargetStates | None) -> None:
        """The first step of a batch that uses this proposer (not always the batch's first step: a
        controller may start it later): per active row its prompt and generated tokens, the last
        being the pending token (not yet in the target's cache); `states` those of the target's latest
        forward (its last kept position chose the pending token) when the proposer wants them."""
        self.params = params
        self.rows = [self.new_row_state(c) for c in contexts]

    def add_rows(self, contexts: list[list[int]], states: TargetStates | None) -> None:
        """Rows joining the batch after its start (continuous batching), after the rows there are, as
        `start` gives them: their contexts and the states of their prefill."""
        self.rows += [self.new_row_state(c) for c in contexts]

    def new_row_state(self, context: list[int]) -> RowState:
        """The record of a row joining with `context` (its prompt and generated tokens, the pending one last)."""
        raise NotImplementedError(f"{type(self).__name__} must define new_row_state")

    def keep_rows(self, rows: list[int]) -> None:
        """Only these rows (batch indices, in order) stay in the batch; the others finished (maybe all)."""
        self.rows = [self.rows[r] for r in rows]

    def use_cache(self, kv: RaggedKV) -> None:
        """The batch's cache, for a proposer that `shares_cache`."""
        raise NotImplementedError(f"{type(self).__name__} does not share the target's cache")

    def propose(self, context: ProposalContext) -> list[Draft]:
        """One draft per row below its pending token. Not called on steps that do not speculate."""
        raise NotImplementedError(f"{type(self).__name__} must define propose")

    def emitted(self, emitted: list[list[int]], states: TargetStates | None) -> None:
        """Per row, the tokens emitted this step (every step, drafted or not); the last one is the
        row's new pending token. `states`, for a proposer that wants hidden states or verify logits:
        the target's states at the positions the step(s) fed and kept (the previous pending token,
        then the accepted draft tokens), one run of plain steps at once; the last kept position chose
        the new pending token. Its `hidden` is None unless the proposer wants hidden states, its
        `logits` None but after a verify step for a proposer that wants them."""

    def stats(self) -> dict[str, float]:
        """Proposer-specific numbers for the batch's throughput record (e.g. the trie's size)."""
        return {}
