"""Jacobi decoding (Santilli et al. 2023): guess a block of tokens, refine all of them in parallel.

One Jacobi iteration is one verify step: the row's current guess is the draft, and the target's
choice at every draft slot is, by the fixed-point update y_i^(k+1) = argmax p(· | x, y^k_<i), the
next guess. Exact matching (`tree_walks.walk`) commits the longest prefix the target agrees with,
plus its own token: the converged prefix is committed every iteration (fast-forwarding), and the
fixed point is exactly greedy decoding, so the output is greedy decoding's.

Modes, per row:
- `pj` (parallel Jacobi): the whole remaining output is one block.
- `pgj` (Gauss-Seidel Jacobi): blocks of `block_size` in turn; a block's unverified tail is kept
  across iterations, a new block starts from `init` once the old one is committed.
- `hgj` (hybrid): `pgj` while a whole block still fits before `max_new_tokens`, then plain decoding;
  a guess is cut after an EOS (nothing after it would be emitted).

`init` guesses a position never seen: `pad` (the EOS id), `repeat` (the context's last tokens, in
order), or `retrieval` (what followed the latest earlier occurrence of the context's last n-gram,
as prompt lookup finds it; `repeat` where nothing is found).

Jacobi decodes greedily: at temperature > 0 its drafter is off and the rows decode plainly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strategies.base import GenerationParams
from strategies.proposers.prompt_lookup import NgramIndex
from strategies.runtime.sampling import greedy_tokens
from strategies.runtime.target_states import TargetStates
from strategies.verification.drafts import Draft
from strategies.verification.proposer import ProposalContext, Proposer


@dataclass
class _Row:
    """One row's Jacobi state: its context, current guess and block bookkeeping."""

    context: list[int]  # prompt and generated tokens, the pending one last
    index: NgramIndex | None  # n-grams of the context (retrieval init only)
    guess: list[int] = field(default_factory=list)  # guessed tokens after the pending one
    stable: list[bool] = field(default_factory=list)  # per guessed token: unchanged by the last iteration
    block_left: int = 0  # tokens of the current block not yet committed
    drafted: int = 0  # tokens of the guess verified in the step under way


class JacobiProposer(Proposer[_Row]):
    """The next iterate is the target's choice at every slot of the verify forward: its logits, not
    its hidden states (`wants_verify_logits`)."""

    name = "jacobi"
    wants_verify_logits = True
    # What it implements; `strategies.methods.jacobi` offers the same as `strategy.jacobi.mode` and `init`.
    MODES = ("pj", "pgj", "hgj")
    INITS = ("pad", "repeat", "retrieval")

    def __init__(self, mode: str, block_size: int, init: str) -> None:
        if mode not in self.MODES or init not in self.INITS:
            raise ValueError(f"jacobi: mode must be one of {self.MODES}, init one of {self.INITS}")
        self.mode, self.block_size, self.init = mode, block_size, init
        self.blocks = self.iterations = self.committed = self.fast_forwarded = self.stationary = 0

    def start(self, contexts: list[list[int]], params: GenerationParams, states: TargetStates | None) -> None:
        self.eos = frozenset() if params.ignore_eos else params.eos_token_ids
        self.pad = min(params.eos_token_ids, default=0)
        self.blocks = self.iterations = self.committed = self.fast_forwarded = self.stationary = 0
        super().start(contexts, params, states)

    def new_row_state(self, context: list[int]) -> _Row:
        row = _Row(list(context), NgramIndex(context, 1, 3) if self.init == "retrieval" else None)
        self._new_block(row, self.params.max_new_tokens if self.mode == "pj" else self.block_size)
        return row

    def _guess(self, row: _Row, n: int) -> list[int]:
        """`n` tokens guessed for positions no iteration has seen."""
        if self.init == "pad":
            return [self.pad] * n
        found = row.index.continuation(n) if row.index is not None else []
        tail = row.context[-max(1, n) :]
        repeat = (tail * (n // len(tail) + 1))[:n]
        return (found + repeat[len(found) :])[:n]

    def _new_block(self, row: _Row, size: int) -> None:
        self.blocks += 1
        row.block_left = size
        self._top_up(row)

    def _top_up(self, row: _Row) -> None:
        missing = row.block_left - len(row.guess)
        if missing > 0:
            row.guess += self._guess(row, missing)
            row.stable += [False] * missing

    def propose(self, context: ProposalContext) -> list[Draft]:
        drafts = []
        for row, budget in zip(self.rows, context.budgets, strict=True):
            n = min(budget, len(row.guess))
            if self.mode == "hgj" and budget < min(self.block_size, row.block_left):
                n = 0  # the tail before max_new_tokens decodes plainly
            row.drafted = n
            drafts.append(Draft.chain(row.guess[:n]))
        return drafts

    def emitted(self, emitted: list[list[int]], states: TargetStates | None) -> None:
        verified = states is not None and states.logits is not None and any(r.drafted for r in self.rows)
        choices = greedy_tokens(states.logits).tolist() if verified else None  # [B][W]
        for b, (row, tokens) in enumerate(zip(self.rows, emitted, strict=True)):
            if choices is not None and row.drafted:
                self._iterate(row, tokens, choices[b])
            else:  # a plain step (or a row left out): positions move on by what was emitted
                del row.guess[: len(tokens)], row.stable[: len(tokens)]
            row.drafted = 0
            row.context.extend(tokens)
            if row.index is not None:
                row.index.extend(tokens)
            row.block_left -= len(tokens)
            if row.block_left <= 0:
                self._new_block(row, self.block_size - (-row.block_left) if self.mode != "pj" else 0)
            if self.mode == "hgj":
                cut = next((i for i, t in enumerate(row.guess) if t in self.eos), None)
                if cut is not None:
                    del row.guess[cut + 1 :], row.stable[cut + 1 :]

    def _iterate(self, row: _Row, tokens: list[int], choices: list[int]) -> None:
        """One Jacobi iteration of `row`: it committed `tokens` (accepted guess, then the target's);
        the target's choices at the slots past them are the next guess for their positions."""
        accepted = len(tokens) - 1
        self.iterations += 1
        self.committed += len(tokens)
        self.fast_forwarded += max(0, len(tokens) - 1)
        self.stationary += sum(row.stable[:accepted])
        n = row.drafted
        # guess[j] is the position j+1 after the pending token; slot s predicts position s+1.
        updated = choices[accepted + 1 : n + 1]  # positions accepted+2 .. n+1
        old = row.guess[accepted + 1 : n + 1]  # one shorter when the whole guess was drafted
        stable = [u == o for u, o in zip(updated, old, strict=False)] + [False] * (len(updated) - len(old))
        row.guess = updated + row.guess[n + 1 :]
        row.stable = stable + row.stable[n + 1 :]

    def stats(self) -> dict[str, float]:
        """Jacobi's trajectory signatures (CLLM's): iterations per block, tokens committed per iteration,
        fast-forwarded tokens (beyond one committed in an iteration) and stationary tokens (committed
        after holding their value through an earlier iteration, while tokens before them were wrong)."""
        return {
            "jacobi_iterations": self.iterations,
            "jacobi_blocks": self.blocks,
            "jacobi_iterations_per_block": round(self.iterations / self.blocks, 3) if self.blocks else 0.0,
            "jacobi_committed": self.committed,
            "jacobi_committed_per_iteration": round(self.committed / self.iterations, 3) if self.iterations else 0.0,
            "jacobi_fast_forwarded": self.fast_forwarded,
            "jacobi_stationary": self.stationary,
        }
