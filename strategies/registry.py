"""Every strategy, declared once: its options' checks, the models it needs, how it is built, whether it is
lossless and the output columns it fills (`StrategySpec`, one entry of `_SPECS`). An unknown name fails
loudly with the list of known ones.

Every drafting strategy is the speculative loop (`speculative.py`) with one drafter: a proposer,
its limits and the acceptance rule it is verified with (`rules.py`, applied by `acceptance.py` through
`verify.py`). Such a strategy is lossless exactly when its rule under the options is
(`AcceptanceRule.lossless`), so no table of names can disagree with the rule that runs. `auto` is the
loop with several drafters under the controller, which also chooses plain autoregressive steps. A new
method of the field is one proposer file and one `_drafting(...)` entry in `_SPECS`.

A job's driver reads the declarations (checks, needs, refusals, lossiness, columns) before Ray's
actors load anything, and imports no torch: a cold job's Ray start shares the machine's cores with
the driver's imports, and torch and transformers were most of them. So what a declaration needs of a
strategy's code is torch-free (`declared.py`, `options.py`, `rules.py`, `drafting.py`, `medusa_choices.py`), and each
builder imports the strategy's own code where it builds it, in the actor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from strategies.base import OutputColumns, Strategy
from strategies.declared import (
    CALM_LOGPROBS_REFUSAL,
    CALM_OUTPUT_COLUMNS,
    CMLM_DRAFTER,
    DRAFT_MODEL,
    MASK_PREDICT_LOGPROBS_REFUSAL,
    MASK_PREDICT_OUTPUT_COLUMNS,
    ChainDrafter,
)
from strategies.options import (
    CALM_BATCH_EXITS,
    CALM_MEASURES,
    EAGLE_TREES,
    JACOBI_INITS,
    JACOBI_MODES,
    LOOKAHEAD_MODES,
    MEDUSA_ACCEPTANCE,
    PROMPT_LOOKUP_SIZINGS,
    StrategyOptions,
    out_of_bounds,
)
from strategies.proposers.draft_sizing import AcceptanceRecord, linear_step_costs
from strategies.proposers.medusa_choices import chain_choices, check_choices
from strategies.verification.control import AUTOREGRESSIVE, Controller
from strategies.verification.drafting import DraftingMethod
from strategies.verification.rules import AcceptanceRule, ExactMatch, RejectionSampling, Relaxed, Typical

if TYPE_CHECKING:
    from strategies.proposers.prompt_lookup import PromptLookupProposer
    from strategies.runtime.runner import ModelRunner
AUTO = "auto"
CALM = "calm"  # not a drafter: its own loop, lossy, never among `auto`'s candidates
MASK_PREDICT = "mask_predict"  # not a drafter either: the CMLM alone, lossy, never among `auto`'s candidates


class Models:
    """What strategies draft and verify with: the target, and optional models by kind (`draft`, `heads`,
    `exits`, `cmlm`, `eagle`: the `model.<kind>` keys, whose table is `workers/common/model_kinds.py`).

    An optional model may be given as a loader instead (`loaders`, by kind): it is loaded the first time
    a strategy that uses it is created (`get`), so a job whose strategies never draft with the draft
    model never reads it. `load_s` says how long each loader took, for the job's start-up phases.
    """

    def __init__(self, target: ModelRunner, loaders: dict[str, Callable[[], Any]] | None = None, **loaded: Any) -> None:
        self.target = target
        self.loaded = {kind: model for kind, model in loaded.items() if model is not None}
        self.loaders = dict(loaders or {})
        self.load_s: dict[str, float] = {}

    def available(self) -> set[str]:
        """The optional models that are loaded or can be."""
        return set(self.loaded) | set(self.loaders)

    def get(self, kind: str) -> Any:
        """The optional model of `kind`, loaded now if it was given as a loader; None if it was not given."""
        if kind not in self.loaded and kind in self.loaders:
            began = time.perf_counter()
            self.loaded[kind] = self.loaders.pop(kind)()
            self.load_s[kind] = time.perf_counter() - began
        return self.loaded.get(kind)


def _need(models: Models, kind: str, strategy: str) -> Any:
    """The optional model of `kind` for `strategy`, or an error naming its key. A job asks for its
    strategies' models before it starts (`workers.common.model_kinds.missing_models`), so this is the last
    word of a direct caller that did not."""
    found = models.get(kind)
    if found is None:
        raise ValueError(f"strategy {strategy} needs a model of kind {kind}, and none was given: set model.{kind}")
    return found


@dataclass(frozen=True)
class StrategySpec:
    """One strategy, in one place. Built by `_drafting` or `_decoder`, which derive what can be derived.

    `needs`: the model kinds it uses under these options (`model.<kind>` keys). `check`: what is wrong
    with its own options (`strategy.<name>.*`), each naming its key; checked for every job, since a
    strategy column may name any strategy. `refusal`: why it cannot decode rows of this job (greedy or
    not, log-probabilities asked or not), or None. `lossy`: why it may emit other tokens than the
    target would, or None. `build`: the strategy, from loaded models and the actor's controller.
    `drafter`: drafting strategies only, the drafter `auto` runs it as. `output_columns`: the columns
    it fills for its rows (`strategies.base.OutputColumns`).
    """

    name: str
    needs: Callable[[StrategyOptions], tuple[str, ...]]
    check: Callable[[StrategyOptions], list[str]]
    refusal: Callable[[StrategyOptions, bool, bool], str | None]
    lossy: Callable[[StrategyOptions], str | None]
    build: Callable[[StrategyOptions, Models, Controller | None], Strategy]
    drafter: Callable[[StrategyOptions, Models], DraftingMethod] | None = None
    output_columns: OutputColumns = field(default_factory=dict)


def _drafting(
    name: str,
    needs: Callable[[StrategyOptions], tuple[str, ...]],
    rule: Callable[[StrategyOptions], AcceptanceRule],
    drafter: Callable[[StrategyOptions, Models, AcceptanceRule], DraftingMethod],
    check: Callable[[StrategyOptions], list[str]],
) -> StrategySpec:
    """A drafting strategy: `rule` is the acceptance rule it verifies with under the options, which alone
    decides whether it is lossless and whether it can sample."""

    def lossy(options: StrategyOptions) -> str | None:
        verifier = rule(options)
        if verifier.lossless:
            return None
        return f"{verifier.name} acceptance ({verifier!r}, strategy.{name}) may keep tokens the target would not choose"

    def refusal(options: StrategyOptions, greedy: bool, logprobs: bool) -> str | None:
        refused = rule(options).refusal(greedy, trees=False)
        return None if refused is None else f"strategy.name={name}: {refused}"

    def built(options: StrategyOptions, models: Models) -> DraftingMethod:
        return drafter(options, models, rule(options))

    return StrategySpec(
        name,
        needs,
        check,
        refusal,
        lossy,
        lambda options, models, controller: _speculative(name, models.target, [built(options, models)], controller),
        drafter=built,
    )


def _speculative(
    name: str, target: ModelRunner, drafters: list[DraftingMethod], controller: Controller | None
) -> Strategy:
    from strategies.verification.speculative import SpeculativeStrategy

    return SpeculativeStrategy(name, target, drafters, controller)


def _decoder(
    name: str,
    output_columns: OutputColumns,
    needs: tuple[str, ...],
    lossy: Callable[[StrategyOptions], str | None],
    build: Callable[[StrategyOptions, Models], Strategy],
    check: Callable[[StrategyOptions], list[str]] = lambda options: [],
    refusal: Callable[[StrategyOptions, bool, bool], str | None] = lambda options, greedy, logprobs: None,
) -> StrategySpec:
    """A strategy with a loop of its own, and the columns it fills (`output_columns`)."""
    return StrategySpec(
        name,
        lambda options: needs,
        check,
        refusal,
        lossy,
        lambda options, models, controller: build(options, models),
        output_columns=dict(output_columns),
    )


_CHAIN_DRAFTERS = {d.name: d for d in (DRAFT_MODEL, CMLM_DRAFTER)}  # `strategy.<name>.drafter` values


def _chosen_chain_drafter(name: str, options: StrategyOptions) -> ChainDrafter:
    """The drafter `strategy.<name>.drafter` names (speculative or specdec); an unknown one is the
    default's, after `check` has reported it."""
    return _CHAIN_DRAFTERS.get(getattr(options, name).drafter, DRAFT_MODEL)


def _check_drafter(name: str) -> Callable[[StrategyOptions], list[str]]:
    def check(options: StrategyOptions) -> list[str]:
        drafter = getattr(options, name).drafter
        if drafter not in _CHAIN_DRAFTERS:
            return [f"strategy.{name}.drafter={drafter!r}: use one of {', '.join(_CHAIN_DRAFTERS)}"]
        return []

    return check


def _chain_drafter(name: str) -> Callable[[StrategyOptions, Models, AcceptanceRule], DraftingMethod]:
    def drafter(options: StrategyOptions, models: Models, rule: AcceptanceRule) -> DraftingMethod:
        from strategies.proposers.cmlm_proposer import CMLMProposer
        from strategies.proposers.draft_model import DraftModelProposer

        k = options.num_speculative_tokens
        declared = _chosen_chain_drafter(name, options)
        proposer = {DRAFT_MODEL: DraftModelProposer, CMLM_DRAFTER: CMLMProposer}[declared]
        return DraftingMethod(name, proposer(_need(models, declared.model, name), models.target.vocab_size), k, k, rule)

    return drafter


def _speculative_rule(options: StrategyOptions) -> AcceptanceRule:
    # A drafter without draft probabilities (the CMLM's argmax tokens) is verified exactly.
    return RejectionSampling() if _chosen_chain_drafter("speculative", options).draft_probabilities else ExactMatch()


def _check_specdec(options: StrategyOptions) -> list[str]:
    sd = options.specdec
    return _check_drafter("specdec")(options) + out_of_bounds(
        [
            ("strategy.specdec.top_beta", sd.top_beta, sd.top_beta >= 1, ">= 1"),
            ("strategy.specdec.tolerance", sd.tolerance, sd.tolerance >= 0, ">= 0 (0 with top_beta=1: exact greedy)"),
        ]
    )


def _prompt_lookup(options: StrategyOptions, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    """Copied text is accepted whole more often than a model's guesses. By acceptance, each draft may be
    up to `max_speculative_tokens` long and the proposer cuts it to what its kind of match pays for (k
    is then only the controller's first guess at its usual length); fixed, drafts start at k tokens and
    the controller may lengthen them where they keep being accepted."""
    k = options.num_speculative_tokens
    cap = max(k, options.prompt_lookup.max_speculative_tokens)
    return DraftingMethod("prompt_lookup", _lookup_proposer(options, cap), cap, cap, rule, start_depth=k)


def _lookup_proposer(options: StrategyOptions, cap: int) -> PromptLookupProposer:
    """Prompt lookup as `strategy.prompt_lookup` configures it, drafting at most `cap` tokens: the
    strategy's own proposer, and the first try of Lookahead's (`strategy.lookahead.prompt_lookup_first`)."""
    from strategies.proposers.prompt_lookup import PromptLookupProposer

    o = options.prompt_lookup
    return PromptLookupProposer(
        o.min_ngram,
        o.max_ngram,
        AcceptanceRecord() if o.sizing == "acceptance" else None,
        linear_step_costs(o.draft_step_cost, o.draft_token_cost, cap),
    )


def _check_prompt_lookup(options: StrategyOptions) -> list[str]:
    pl = options.prompt_lookup
    return _one_of("strategy.prompt_lookup.sizing", pl.sizing, PROMPT_LOOKUP_SIZINGS) + out_of_bounds(
        [
            ("strategy.prompt_lookup.min_ngram", pl.min_ngram, pl.min_ngram >= 1, ">= 1"),
            (
                "strategy.prompt_lookup.max_ngram",
                pl.max_ngram,
                pl.max_ngram >= pl.min_ngram,
                f">= strategy.prompt_lookup.min_ngram ({pl.min_ngram})",
            ),
            (
                "strategy.prompt_lookup.max_speculative_tokens",
                pl.max_speculative_tokens,
                pl.max_speculative_tokens >= 1,
                ">= 1",
            ),
            ("strategy.prompt_lookup.draft_step_cost", pl.draft_step_cost, pl.draft_step_cost > 0, "> 0"),
            ("strategy.prompt_lookup.draft_token_cost", pl.draft_token_cost, pl.draft_token_cost >= 0, ">= 0"),
        ]
    )


def _lookahead(options: StrategyOptions, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    from strategies.proposers.lookahead import LookaheadProposer

    o = options.lookahead
    lookup = _lookup_proposer(options, o.branch_length) if o.prompt_lookup_first else None
    proposer = LookaheadProposer(
        o.decoding_length, o.branch_length, o.max_query_length, o.mode, o.max_nodes, o.own_prompt_weight, lookup
    )
    return DraftingMethod(
        "lookahead", proposer, o.branch_length, o.decoding_length, rule, trees=proposer.drafts_trees, learns=True
    )


def _check_lookahead(options: StrategyOptions) -> list[str]:
    la = options.lookahead
    return _one_of("strategy.lookahead.mode", la.mode, LOOKAHEAD_MODES) + out_of_bounds(
        [
            ("strategy.lookahead.decoding_length", la.decoding_length, la.decoding_length >= 1, ">= 1"),
            ("strategy.lookahead.branch_length", la.branch_length, la.branch_length >= 1, ">= 1"),
            ("strategy.lookahead.max_query_length", la.max_query_length, la.max_query_length >= 1, ">= 1"),
            ("strategy.lookahead.max_nodes", la.max_nodes, la.max_nodes >= 1, ">= 1"),
            ("strategy.lookahead.own_prompt_weight", la.own_prompt_weight, la.own_prompt_weight >= 0, ">= 0"),
        ]
    )


def _medusa_rule(options: StrategyOptions) -> AcceptanceRule:
    o = options.medusa
    return Typical(o.typical_epsilon, o.typical_delta) if o.acceptance == "typical" else ExactMatch()


def _medusa(options: StrategyOptions, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    from strategies.proposers.medusa import HeadsProposer

    o, heads = options.medusa, _need(models, "heads", "medusa")
    problem = check_choices(o.choices, heads.num_heads, models.target.vocab_size)
    if problem is not None:
        raise ValueError(f"strategy.medusa.choices: {problem}")
    depth = max(len(c) for c in o.choices)
    branching = len({tuple(c) for c in o.choices}) > depth
    return DraftingMethod(
        "medusa", HeadsProposer("medusa", heads, o.choices), depth, len(o.choices), rule, trees=branching
    )


def _check_medusa(options: StrategyOptions) -> list[str]:
    md = options.medusa
    found = _one_of("strategy.medusa.acceptance", md.acceptance, MEDUSA_ACCEPTANCE) + out_of_bounds(
        [
            ("strategy.medusa.typical_epsilon", md.typical_epsilon, md.typical_epsilon > 0, "> 0"),
            ("strategy.medusa.typical_delta", md.typical_delta, md.typical_delta > 0, "> 0"),
        ]
    )
    if not md.choices:
        found.append("strategy.medusa.choices is empty: give at least one path, e.g. [[0]]")
    else:
        shape = check_choices(md.choices)  # the heads' depth and the vocabulary are checked as the heads load
        if shape is not None:
            found.append(f"strategy.medusa.choices: {shape}")
    return found


def _blockwise_rule(options: StrategyOptions) -> AcceptanceRule:
    top_k = options.blockwise.top_k
    return Relaxed(top_k) if top_k > 1 else ExactMatch()


def _blockwise(options: StrategyOptions, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    from strategies.proposers.medusa import HeadsProposer

    heads = _need(models, "heads", "blockwise")
    k = min(options.num_speculative_tokens, heads.num_heads)
    return DraftingMethod("blockwise", HeadsProposer("blockwise", heads, chain_choices(k)), k, k, rule)


def _check_blockwise(options: StrategyOptions) -> list[str]:
    top_k = options.blockwise.top_k
    return out_of_bounds([("strategy.blockwise.top_k", top_k, top_k >= 1, ">= 1 (1: exact)")])


def _eagle(options: StrategyOptions, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    from strategies.proposers.eagle import EagleProposer

    o, head = options.eagle, _need(models, "eagle", "eagle")
    if o.tree == "chain":
        return DraftingMethod("eagle", EagleProposer(head, top_k=1), o.depth, o.depth, rule)
    static_nodes = o.nodes if o.tree == "static" else 0
    return DraftingMethod("eagle", EagleProposer(head, o.top_k, static_nodes), o.depth, o.nodes, rule, trees=True)


def _check_eagle(options: StrategyOptions) -> list[str]:
    eg = options.eagle
    return _one_of("strategy.eagle.tree", eg.tree, EAGLE_TREES) + out_of_bounds(
        [
            ("strategy.eagle.depth", eg.depth, eg.depth >= 1, ">= 1"),
            ("strategy.eagle.top_k", eg.top_k, eg.top_k >= 1, ">= 1"),
            ("strategy.eagle.nodes", eg.nodes, eg.nodes >= 1, ">= 1"),
        ]
    )


def _jacobi(options: StrategyOptions, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    from strategies.proposers.jacobi import JacobiProposer

    o = options.jacobi
    depth = models.target.max_context if o.mode == "pj" else o.block_size
    return DraftingMethod("jacobi", JacobiProposer(o.mode, o.block_size, o.init), depth, depth, rule, greedy_only=True)


def _check_jacobi(options: StrategyOptions) -> list[str]:
    jc = options.jacobi
    return (
        _one_of("strategy.jacobi.mode", jc.mode, JACOBI_MODES)
        + _one_of("strategy.jacobi.init", jc.init, JACOBI_INITS)
        + out_of_bounds([("strategy.jacobi.block_size", jc.block_size, jc.block_size >= 1, ">= 1")])
    )


def _self_speculative(options: StrategyOptions, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    from strategies.proposers.self_speculative import SelfSpeculativeProposer

    k, o = options.num_speculative_tokens, options.self_speculative
    exits = _need(models, "exits", "self_speculative")
    proposer = SelfSpeculativeProposer(models.target, exits, o.exit_layer, o.min_confidence)
    return DraftingMethod("self_speculative", proposer, k, k, rule)


def _check_self_speculative(options: StrategyOptions) -> list[str]:
    ss = options.self_speculative
    return out_of_bounds(
        [
            ("strategy.self_speculative.exit_layer", ss.exit_layer, ss.exit_layer >= 1, ">= 1"),
            ("strategy.self_speculative.min_confidence", ss.min_confidence, 0 <= ss.min_confidence <= 1, "in [0, 1]"),
        ]
    )


def _autoregressive(options: StrategyOptions, models: Models) -> Strategy:
    from strategies.decoders.autoregressive import AutoregressiveStrategy

    return AutoregressiveStrategy(models.target)


def _calm(options: StrategyOptions, models: Models) -> Strategy:
    from strategies.decoders.calm import CalmStrategy

    return CalmStrategy(models.target, _need(models, "exits", CALM), options.calm)


def _mask_predict(options: StrategyOptions, models: Models) -> Strategy:
    from strategies.decoders.mask_predict import MaskPredictStrategy

    return MaskPredictStrategy(_need(models, "cmlm", MASK_PREDICT), options.mask_predict)


def _calm_lossy(options: StrategyOptions) -> str:
    return (
        "CALM's early exit (strategy.calm): a token may be an intermediate layer's guess, chosen where its "
        f"{options.calm.measure} confidence reached {options.calm.threshold}"
    )


def _check_calm(options: StrategyOptions) -> list[str]:
    cm = options.calm
    return (
        _one_of("strategy.calm.measure", cm.measure, CALM_MEASURES)
        + _one_of("strategy.calm.batch_exit", cm.batch_exit, CALM_BATCH_EXITS)
        + out_of_bounds(
            [
                ("strategy.calm.threshold", cm.threshold, cm.threshold > 0, "> 0"),
                ("strategy.calm.decay_tau", cm.decay_tau, cm.decay_tau >= 0, ">= 0 (0: a constant threshold)"),
                ("strategy.calm.min_layer", cm.min_layer, cm.min_layer >= 1, ">= 1"),
            ]
        )
    )


def _check_mask_predict(options: StrategyOptions) -> list[str]:
    mp = options.mask_predict
    return out_of_bounds(
        [
            ("strategy.mask_predict.iterations", mp.iterations, mp.iterations >= 1, ">= 1"),
            ("strategy.mask_predict.length_beam", mp.length_beam, mp.length_beam >= 1, ">= 1"),
            ("strategy.mask_predict.max_length", mp.max_length, mp.max_length >= 0, ">= 0 (0: the CMLM's own)"),
        ]
    )


def _one_of(key: str, value: str, allowed: tuple[str, ...] | list[str]) -> list[str]:
    return [] if value in allowed else [f"{key}={value!r}: use one of {', '.join(allowed)}"]


def _mask_predict_refusal(options: StrategyOptions, greedy: bool, logprobs: bool) -> str | None:
    if logprobs:
        return MASK_PREDICT_LOGPROBS_REFUSAL
    if not greedy:
        return (
            "strategy.name=mask_predict fills blocks with the CMLM's most likely tokens and has no sampling "
            "variant: use temperature 0"
        )
    return None


# Drafting strategies in the order `auto` explores them where nothing tells their costs apart yet:
# lookups that run no model first, then draft heads, then drafters that run a model per token.
_SPECS: dict[str, StrategySpec] = {
    spec.name: spec
    for spec in (
        _decoder(AUTOREGRESSIVE, {}, (), lambda o: None, _autoregressive),
        _drafting("prompt_lookup", lambda o: (), lambda o: ExactMatch(), _prompt_lookup, _check_prompt_lookup),
        _drafting("lookahead", lambda o: (), lambda o: ExactMatch(), _lookahead, _check_lookahead),
        _drafting("medusa", lambda o: ("heads",), _medusa_rule, _medusa, _check_medusa),
        _drafting("blockwise", lambda o: ("heads",), _blockwise_rule, _blockwise, _check_blockwise),
        _drafting("eagle", lambda o: ("eagle",), lambda o: ExactMatch(), _eagle, _check_eagle),
        _drafting("jacobi", lambda o: (), lambda o: ExactMatch(), _jacobi, _check_jacobi),
        _drafting(
            "speculative",
            lambda o: (_chosen_chain_drafter("speculative", o).model,),
            _speculative_rule,
            _chain_drafter("speculative"),
            _check_drafter("speculative"),
        ),
        _drafting(
            "specdec",
            lambda o: (_chosen_chain_drafter("specdec", o).model,),
            lambda o: Relaxed(o.specdec.top_beta, o.specdec.tolerance),
            _chain_drafter("specdec"),
            _check_specdec,
        ),
        _drafting(
            "self_speculative",
            lambda o: ("exits",),
            lambda o: RejectionSampling(),
            _self_speculative,
            _check_self_speculative,
        ),
        _decoder(
            CALM,
            CALM_OUTPUT_COLUMNS,
            ("exits",),
            _calm_lossy,
            _calm,
            _check_calm,
            lambda o, greedy, logprobs: CALM_LOGPROBS_REFUSAL if logprobs else None,
        ),
        _decoder(
            MASK_PREDICT,
            MASK_PREDICT_OUTPUT_COLUMNS,
            ("cmlm",),
            lambda o: (
                "Mask-Predict (strategy.mask_predict): the conditional masked LM's parallel guesses, never checked "
                "against the target"
            ),
            _mask_predict,
            _check_mask_predict,
            _mask_predict_refusal,
        ),
    )
}


def available() -> list[str]:
    return sorted([AUTO, *_SPECS])


def drafting() -> list[str]:
    """Strategies that draft and verify: what `auto` can choose among."""
    return sorted(name for name, spec in _SPECS.items() if spec.drafter is not None)


def output_columns() -> OutputColumns:
    """Every output column a strategy declares (name -> Python type of its values), in `_SPECS` order."""
    return {column: kind for spec in _SPECS.values() for column, kind in spec.output_columns.items()}


def lossy_reason(name: str, options: StrategyOptions) -> str | None:
    """Why strategy `name` with these options may emit other tokens than the target would, or None;
    `auto` is lossy through its lossy `strategy.candidates` (only with `strategy.allow_lossy_candidates`)."""
    if name == AUTO:
        reasons = [f"{c}: {r}" for c in options.candidates if c in _SPECS and (r := lossy_reason(c, options))]
        return f"auto chooses by timing among lossy candidates ({'; '.join(reasons)})" if reasons else None
    spec = _SPECS.get(name)
    return None if spec is None else spec.lossy(options)


def needs_models(name: str, options: StrategyOptions) -> set[str]:
    """Which optional model kinds strategy `name` uses; `auto` those of its
    `strategy.candidates`, or any when they are left to the models at hand."""
    if name == AUTO:
        if options.candidates:
            return set().union(*(needs_models(c, options) for c in options.candidates if c != AUTO))
        return set().union(*(spec.needs(options) for spec in _SPECS.values()))
    spec = _SPECS.get(name)
    return set() if spec is None else set(spec.needs(options))


def models_needed(options: StrategyOptions) -> set[str]:
    """The model kinds (`model.<kind>` keys) the strategy `options.name` uses under its options."""
    return needs_models(options.name, options)


def auto_candidates(options: StrategyOptions, has: set[str]) -> list[str]:
    """`strategy.candidates`, or every lossless drafting strategy whose models (`has`) are available, in
    `_SPECS` order: cheapest drafting first."""
    if options.candidates:
        return list(options.candidates)
    return [
        n
        for n, spec in _SPECS.items()
        if spec.drafter is not None and lossy_reason(n, options) is None and needs_models(n, options) <= has
    ]


def problems(options: StrategyOptions, greedy: bool, logprobs: bool = False) -> list[str]:
    """What is wrong with the strategy options for this job (`logprobs`: it reports the target's
    log-probabilities), each naming its key (empty: nothing). Every strategy's own options are checked,
    since a strategy column may name any of them."""
    found = []
    name = options.name
    if name not in available():
        found.append(f"strategy.name {name!r} is unknown; available: {', '.join(available())}")
    elif name == AUTO:
        found.extend(_auto_problems(options))
    else:
        refused = _SPECS[name].refusal(options, greedy, logprobs)
        found.extend([refused] if refused else [])
    k = options.num_speculative_tokens
    found.extend(out_of_bounds([("strategy.num_speculative_tokens", k, k >= 0, ">= 0")]))
    for spec in _SPECS.values():
        found.extend(spec.check(options))
    return found


def _auto_problems(options: StrategyOptions) -> list[str]:
    found = []
    if not options.adaptive:
        found.append("strategy.name=auto chooses per step with the controller: keep strategy.adaptive=true")
    unknown = sorted(set(options.candidates) - set(drafting()))
    if unknown:
        found.append(f"strategy.candidates {unknown} are unknown; available: {', '.join(drafting())}")
    lossy = [c for c in options.candidates if c in drafting() and lossy_reason(c, options) is not None]
    if lossy and not options.allow_lossy_candidates:
        found.append(
            f"strategy.candidates {lossy} are lossy: `auto` would choose among them by timing, so a row's tokens "
            "could change from run to run; drop them from strategy.candidates, or set "
            "strategy.allow_lossy_candidates=true to accept that"
        )
    return found


def create(options: StrategyOptions, models: Models, controller: Controller | None = None) -> Strategy:
    """The strategy `options.name`; drafting strategies run under `controller` when one is given."""
    name = options.name
    if name == AUTO:
        if controller is None:
            raise ValueError("strategy 'auto' chooses per step: it needs the controller (strategy.adaptive=true)")
        names = auto_candidates(options, models.available())
        unknown = sorted(set(names) - set(drafting()))
        if unknown:
            raise KeyError(f"strategy.candidates {unknown} are unknown; available: {', '.join(drafting())}")
        drafters = [_checked(_SPECS[n], options).drafter(options, models) for n in names]
        return _speculative(AUTO, models.target, drafters, controller)
    if name not in _SPECS:
        raise KeyError(f"unknown strategy {name!r}; available: {', '.join(available())}")
    return _checked(_SPECS[name], options).build(options, models, controller)


def _checked(spec: StrategySpec, options: StrategyOptions) -> StrategySpec:
    """`spec`, once its options pass its checks (the constructors do not repeat them)."""
    found = spec.check(options)
    if found:
        raise ValueError("; ".join(found))
    return spec
