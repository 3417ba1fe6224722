"""The chain drafters `strategy.speculative.drafter` and `strategy.specdec.drafter` name: a model that
drafts a chain token by token. Both methods draft with either, through the proposers named after them
(`proposers/draft_model.py`, `proposers/cmlm_proposer.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from strategies.methods.spec import Models, StrategySection, grown, need
from strategies.verification.drafting import DraftingMethod

if TYPE_CHECKING:
    from strategies.verification.rules import AcceptanceRule


@dataclass(frozen=True)
class ChainDrafter:
    """A model that drafts a chain token by token, as a `strategy.<name>.drafter` value."""

    name: str  # the `drafter` value
    model: str  # the `model.<kind>` it drafts with
    draft_probabilities: bool  # drafts carry q, as speculative sampling needs


DRAFT_MODEL = ChainDrafter("draft_model", model="draft", draft_probabilities=True)
CMLM_DRAFTER = ChainDrafter("cmlm", model="cmlm", draft_probabilities=False)
CHAIN_DRAFTERS = {d.name: d for d in (DRAFT_MODEL, CMLM_DRAFTER)}
DRAFTERS = tuple(CHAIN_DRAFTERS)  # the `strategy.<name>.drafter` values


def chosen(method: str, options: StrategySection) -> ChainDrafter:
    """The drafter `strategy.<method>.drafter` names; an unknown one is the default's, after
    `check_drafter` has reported it."""
    return CHAIN_DRAFTERS.get(getattr(options, method).drafter, DRAFT_MODEL)


def check_drafter(method: str, options: StrategySection) -> list[str]:
    drafter = getattr(options, method).drafter
    if drafter not in CHAIN_DRAFTERS:
        return [f"strategy.{method}.drafter={drafter!r}: use one of {', '.join(CHAIN_DRAFTERS)}"]
    return []


def chain_drafter(method: str, options: StrategySection, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    """The chosen drafter, drafting `strategy.num_speculative_tokens` tokens per step (the controller: up to
    `grown` of them)."""
    from strategies.proposers.cmlm_proposer import CMLMProposer
    from strategies.proposers.draft_model import DraftModelProposer

    k, bound = options.num_speculative_tokens, grown(options.num_speculative_tokens, options)
    declared = chosen(method, options)
    proposer = {DRAFT_MODEL: DraftModelProposer, CMLM_DRAFTER: CMLMProposer}[declared]
    drafter = proposer(need(models, declared.model, method), models.target.vocab_size)
    return DraftingMethod(method, drafter, bound, bound, rule, start_depth=k)
