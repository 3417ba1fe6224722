"""Strategy names -> constructors. An unknown name fails loudly with the list of known ones."""

from __future__ import annotations

from collections.abc import Callable

from strategies.autoregressive import AutoregressiveStrategy
from strategies.base import Strategy
from strategies.draft_model import DraftModelProposer
from strategies.lookahead import LookaheadProposer
from strategies.options import StrategyOptions
from strategies.prompt_lookup import PromptLookupProposer
from strategies.runner import ModelRunner
from strategies.speculative import RelaxedRule, SpeculativeStrategy


def _speculative(options: StrategyOptions, target: ModelRunner, draft: ModelRunner | None) -> Strategy:
    proposer = DraftModelProposer(_need_draft(draft, options.name), target.vocab_size)
    return SpeculativeStrategy("speculative", target, proposer, options.num_speculative_tokens, relaxed=None)


def _specdec(options: StrategyOptions, target: ModelRunner, draft: ModelRunner | None) -> Strategy:
    proposer = DraftModelProposer(_need_draft(draft, options.name), target.vocab_size)
    rule = RelaxedRule(options.specdec.top_beta, options.specdec.tolerance)
    return SpeculativeStrategy("specdec", target, proposer, options.num_speculative_tokens, relaxed=rule)


def _prompt_lookup(options: StrategyOptions, target: ModelRunner, draft: ModelRunner | None) -> Strategy:
    o = options.prompt_lookup
    proposer = PromptLookupProposer(o.min_ngram, o.max_ngram)
    return SpeculativeStrategy("prompt_lookup", target, proposer, options.num_speculative_tokens)


def _lookahead(options: StrategyOptions, target: ModelRunner, draft: ModelRunner | None) -> Strategy:
    o = options.lookahead
    proposer = LookaheadProposer(
        o.decoding_length, o.branch_length, o.max_query_length, o.mode, o.max_nodes, o.own_prompt_weight
    )
    return SpeculativeStrategy("lookahead", target, proposer, o.branch_length, max_nodes=o.decoding_length)


def _need_draft(draft: ModelRunner | None, name: str) -> ModelRunner:
    if draft is None:
        raise ValueError(f"strategy {name!r} needs a draft model: set model.draft")
    return draft


_REGISTRY: dict[str, Callable[[StrategyOptions, ModelRunner, ModelRunner | None], Strategy]] = {
    "autoregressive": lambda options, target, draft: AutoregressiveStrategy(target),
    "speculative": _speculative,
    "specdec": _specdec,
    "prompt_lookup": _prompt_lookup,
    "lookahead": _lookahead,
}
NEEDS_DRAFT = frozenset({"speculative", "specdec"})


def available() -> list[str]:
    return sorted(_REGISTRY)


def create(options: StrategyOptions, target: ModelRunner, draft: ModelRunner | None = None) -> Strategy:
    if options.name not in _REGISTRY:
        raise KeyError(f"unknown strategy {options.name!r}; available: {', '.join(available())}")
    return _REGISTRY[options.name](options, target, draft)
