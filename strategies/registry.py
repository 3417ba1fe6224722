"""Strategy names -> constructors. An unknown name fails loudly with the list of known ones.

Every drafting strategy is the speculative loop with one drafter; `auto` is the loop with several
drafters under the controller, which also chooses plain autoregressive steps.
"""

from __future__ import annotations

from collections.abc import Callable

from strategies.autoregressive import AutoregressiveStrategy
from strategies.base import Strategy
from strategies.control import AUTOREGRESSIVE, Controller
from strategies.draft_model import DraftModelProposer
from strategies.lookahead import LookaheadProposer
from strategies.options import StrategyOptions
from strategies.prompt_lookup import PromptLookupProposer
from strategies.runner import ModelRunner
from strategies.speculative import Drafter, RelaxedRule, SpeculativeStrategy

AUTO = "auto"


def _speculative(options: StrategyOptions, target: ModelRunner, draft: ModelRunner | None) -> Drafter:
    k = options.num_speculative_tokens
    return Drafter("speculative", DraftModelProposer(_need_draft(draft, "speculative"), target.vocab_size), k, k)


def _specdec(options: StrategyOptions, target: ModelRunner, draft: ModelRunner | None) -> Drafter:
    k = options.num_speculative_tokens
    rule = RelaxedRule(options.specdec.top_beta, options.specdec.tolerance)
    return Drafter("specdec", DraftModelProposer(_need_draft(draft, "specdec"), target.vocab_size), k, k, rule)


def _prompt_lookup(options: StrategyOptions, target: ModelRunner, draft: ModelRunner | None) -> Drafter:
    k, o = options.num_speculative_tokens, options.prompt_lookup
    return Drafter("prompt_lookup", PromptLookupProposer(o.min_ngram, o.max_ngram), k, k)


def _lookahead(options: StrategyOptions, target: ModelRunner, draft: ModelRunner | None) -> Drafter:
    o = options.lookahead
    proposer = LookaheadProposer(
        o.decoding_length, o.branch_length, o.max_query_length, o.mode, o.max_nodes, o.own_prompt_weight
    )
    return Drafter("lookahead", proposer, o.branch_length, o.decoding_length, learns=True)


def _need_draft(draft: ModelRunner | None, name: str) -> ModelRunner:
    if draft is None:
        raise ValueError(f"strategy {name!r} needs a draft model: set model.draft")
    return draft


_DRAFTERS: dict[str, Callable[[StrategyOptions, ModelRunner, ModelRunner | None], Drafter]] = {
    "speculative": _speculative,
    "specdec": _specdec,
    "prompt_lookup": _prompt_lookup,
    "lookahead": _lookahead,
}
NEEDS_DRAFT = frozenset({"speculative", "specdec"})
LOSSY = frozenset({"specdec"})


def available() -> list[str]:
    return sorted([AUTOREGRESSIVE, AUTO, *_DRAFTERS])


def drafting() -> list[str]:
    """Strategies that draft and verify: what `auto` can choose among."""
    return sorted(_DRAFTERS)


def auto_candidates(options: StrategyOptions, has_draft: bool) -> list[str]:
    """`strategy.candidates`, or every lossless drafting strategy whose models are available."""
    if options.candidates:
        return list(options.candidates)
    return [name for name in sorted(_DRAFTERS) if name not in LOSSY and (has_draft or name not in NEEDS_DRAFT)]


def create(
    options: StrategyOptions,
    target: ModelRunner,
    draft: ModelRunner | None = None,
    controller: Controller | None = None,
) -> Strategy:
    """The strategy `options.name`; drafting strategies run under `controller` when one is given."""
    name = options.name
    if name == AUTOREGRESSIVE:
        return AutoregressiveStrategy(target)
    if name == AUTO:
        if controller is None:
            raise ValueError("strategy 'auto' chooses per step: it needs the controller (strategy.adaptive=true)")
        names = auto_candidates(options, draft is not None)
        unknown = sorted(set(names) - set(_DRAFTERS))
        if unknown:
            raise KeyError(f"strategy.candidates {unknown} are unknown; available: {', '.join(drafting())}")
        return SpeculativeStrategy(AUTO, target, [_DRAFTERS[n](options, target, draft) for n in names], controller)
    if name not in _DRAFTERS:
        raise KeyError(f"unknown strategy {name!r}; available: {', '.join(available())}")
    return SpeculativeStrategy(name, target, [_DRAFTERS[name](options, target, draft)], controller)
