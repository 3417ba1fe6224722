"""Speculation metrics of one batch, and their definitions: every report (batch records, the bench,
the controller's events) uses these words in these senses.

- **row step**: one row in one target forward of the decode loop (the prefill is not a step).
- **verify step**: a row step of a verify forward (the row's draft, maybe empty, fed after its
  pending token). **plain step**: a row step of a forward with no drafts (one token in, one out);
  a step where the chosen drafter found nothing for any row is a plain step too.
- **τ** (`tau`): tokens emitted per verify step — accepted draft tokens plus the target's own token
  (correction or bonus) — over the verify steps of the batch; `tau_by_drafter` per drafter. Plain
  steps are left out: under the controller they say nothing of what a drafter yields.
  `tokens_per_row_step` is the batch's overall yield: tokens emitted per row step of any kind.
- **acceptance by position** (`acceptance_by_position[d]`): of the verify steps whose draft had a
  node at depth d+1, the share whose accepted path reached depth d+1. For a chain this is the
  share of draft tokens at position d+1 accepted; for trees of heads it is head d's acceptance.
- **fallbacks**: drafts refused as invalid (`drafts.draft_problem`: a token outside the vocabulary,
  more nodes or a deeper path than the step allows, a malformed tree); the row's verify step goes on
  with an empty draft and emits the target's one token. A proposer or a verify forward that raises
  is a fault (`faults`, per drafter: its messages): the step is decoded plainly and the drafter is off
  for the rest of the batch, so the output stays exact but loses that drafter's speed-up. The job
  summary counts them per drafter (`workers.common.spec.tally_faults`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strategies.verification.acceptance import Verdict
from strategies.verification.drafts import Draft, tree_depths


@dataclass
class SpecStats:
    target_forwards: int = 0  # decode forwards of the target: verify and plain
    row_steps: int = 0
    emitted_tokens: int = 0
    verify_steps: dict[str, int] = field(default_factory=dict)  # per drafter
    verify_emitted: dict[str, int] = field(default_factory=dict)  # per drafter: tokens of its verify steps
    drafts: int = 0  # verify steps with at least one draft token
    draft_tokens: int = 0
    accepted_tokens: int = 0
    fallbacks: int = 0  # invalid drafts replaced by empty ones (see "fallbacks" above)
    faults: dict[str, list[str]] = field(default_factory=dict)  # per drafter: its proposer's and verify faults
    reached_depth: list[int] = field(default_factory=list)  # [d]: verify steps with a node at depth d+1
    accepted_at: list[int] = field(default_factory=list)  # [d]: verify steps accepting depth d+1
    steps_by_drafter: dict[str, int] = field(default_factory=dict)  # target forwards per option

    def record(self, drafter: str, draft: Draft, verdict: Verdict) -> None:
        """One verify step of `drafter`."""
        self.row_steps += 1
        self.emitted_tokens += len(verdict.tokens)
        self.verify_steps[drafter] = self.verify_steps.get(drafter, 0) + 1
        self.verify_emitted[drafter] = self.verify_emitted.get(drafter, 0) + len(verdict.tokens)
        self.drafts += bool(len(draft))
        self.draft_tokens += len(draft)
        self.accepted_tokens += len(verdict.accepted_slots)
        for d in range(max(tree_depths(draft.parents))):
            _bump(self.reached_depth, d)
        for d in range(len(verdict.accepted_slots)):
            _bump(self.accepted_at, d)

    def fault(self, drafter: str, message: str) -> None:
        """A fault of `drafter` (see "fallbacks" above); `message` says where and what was raised."""
        self.faults.setdefault(drafter, []).append(message)

    def record_plain(self, row_steps: int) -> None:
        """Plain steps: each row emitted one token a step."""
        self.row_steps += row_steps
        self.emitted_tokens += row_steps

    def count_forwards(self, option: str, forwards: int) -> None:
        self.target_forwards += forwards
        self.steps_by_drafter[option] = self.steps_by_drafter.get(option, 0) + forwards

    def as_dict(self) -> dict:
        accepted_at = self.accepted_at + [0] * (len(self.reached_depth) - len(self.accepted_at))
        steps = sum(self.verify_steps.values())
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "fallbacks": self.fallbacks,
            "faults": self.faults,
            "steps_by_drafter": self.steps_by_drafter,
            "acceptance_by_position": [round(a / r, 4) for a, r in zip(accepted_at, self.reached_depth, strict=True)],
            "tau": round(sum(self.verify_emitted.values()) / steps, 4) if steps else None,
            "tau_by_drafter": {n: round(self.verify_emitted[n] / s, 4) for n, s in self.verify_steps.items()},
            "tokens_per_row_step": round(self.emitted_tokens / self.row_steps, 4) if self.row_steps else None,
            # The counts behind the ratios, so that reports over many batches weigh them right.
            "verify_steps": self.verify_steps,
            "verify_emitted": self.verify_emitted,
            "reached_depth": self.reached_depth,
            "accepted_at": self.accepted_at,
        }


def _bump(counts: list[int], index: int) -> None:
    counts.extend([0] * (index + 1 - len(counts)))
    counts[index] += 1
