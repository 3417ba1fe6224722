"""Strategy names -> constructors, and each strategy's own option checks. An unknown name fails
loudly with the list of known ones.

Every drafting strategy is the speculative loop (`speculative.py`) with one drafter: a proposer,
its limits and the acceptance rule it is verified with (`acceptance.py`, through `verify.py`);
`auto` is the loop with several drafters under the controller, which also chooses plain
autoregressive steps. A new method of the field is one proposer file and one entry in `_DRAFTERS`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from strategies.acceptance import ExactMatch, RejectionSampling, Relaxed, Typical
from strategies.autoregressive import AutoregressiveStrategy
from strategies.base import Strategy
from strategies.calm import LOGPROBS_REFUSAL, CalmStrategy
from strategies.cmlm import CMLM
from strategies.cmlm_proposer import CMLMProposer
from strategies.control import AUTOREGRESSIVE, Controller
from strategies.draft_model import DraftModelProposer
from strategies.exits import ExitHeads
from strategies.heads import DraftHeads
from strategies.jacobi import INITS, JacobiProposer
from strategies.jacobi import MODES as JACOBI_MODES
from strategies.lookahead import MODES, LookaheadProposer
from strategies.mask_predict import LOGPROBS_REFUSAL as MASK_PREDICT_LOGPROBS_REFUSAL
from strategies.mask_predict import MaskPredictStrategy
from strategies.medusa import HeadsProposer, chain_choices, check_choices
from strategies.options import (
    CALM_BATCH_EXITS,
    CALM_MEASURES,
    DRAFTERS,
    MEDUSA_ACCEPTANCE,
    Bound,
    StrategyOptions,
    out_of_bounds,
)
from strategies.prompt_lookup import PromptLookupProposer
from strategies.proposer import Proposer
from strategies.runner import ModelRunner
from strategies.self_speculative import SelfSpeculativeProposer
from strategies.speculative import Drafter, SpeculativeStrategy

AUTO = "auto"
CALM = "calm"  # not a drafter: its own loop, lossy, never among `auto`'s candidates
MASK_PREDICT = "mask_predict"  # not a drafter either: the CMLM alone, lossy, never among `auto`'s candidates


@dataclass
class Models:
    """What strategies draft and verify with: the target, and the optional draft model, heads, exits and CMLM.

    An optional model may be given as a loader instead (`loaders`, by name): it is loaded the first time
    a strategy that uses it is created (`get`), so a job whose strategies never draft with the draft
    model never reads it. `load_s` says how long each loader took, for the job's start-up phases.
    """

    target: ModelRunner
    draft: ModelRunner | None = None
    heads: DraftHeads | None = None
    exits: ExitHeads | None = None
    cmlm: CMLM | None = None
    loaders: dict[str, Callable[[], Any]] = field(default_factory=dict)
    load_s: dict[str, float] = field(default_factory=dict)

    def available(self) -> set[str]:
        """The optional models that are loaded or can be."""
        return {m for m in OPTIONAL_MODELS if getattr(self, m) is not None or m in self.loaders}

    def get(self, model: str) -> Any:
        """Optional model `model` (one of `OPTIONAL_MODELS`), loaded now if it was given as a loader; None
        if it was not given."""
        if getattr(self, model) is None and model in self.loaders:
            began = time.perf_counter()
            setattr(self, model, self.loaders.pop(model)())
            self.load_s[model] = time.perf_counter() - began
        return getattr(self, model)


def _drafter_of(name: str, options: StrategyOptions) -> str:
    """The model the speculative or specdec strategy drafts with (`strategy.<name>.drafter`)."""
    return options.speculative.drafter if name == "speculative" else options.specdec.drafter


def _chain_proposer(name: str, options: StrategyOptions, models: Models) -> Proposer:
    if _drafter_of(name, options) == "cmlm":
        return CMLMProposer(_need_cmlm(models, name), models.target.vocab_size)
    return DraftModelProposer(_need_draft(models, name), models.target.vocab_size)


def _speculative(options: StrategyOptions, models: Models) -> Drafter:
    k = options.num_speculative_tokens
    proposer = _chain_proposer("speculative", options, models)
    # The CMLM drafts argmax tokens, without probabilities: exact matching keeps it lossless.
    rule = ExactMatch() if proposer.name == "cmlm" else RejectionSampling()
    return Drafter("speculative", proposer, k, k, rule)


def _specdec(options: StrategyOptions, models: Models) -> Drafter:
    k = options.num_speculative_tokens
    rule = Relaxed(options.specdec.top_beta, options.specdec.tolerance)
    return Drafter("specdec", _chain_proposer("specdec", options, models), k, k, rule)


def _prompt_lookup(options: StrategyOptions, models: Models) -> Drafter:
    """Copied text is accepted whole more often than a model's guesses: drafts start at k tokens and
    the controller may lengthen them up to `max_speculative_tokens` where they keep being accepted."""
    k, o = options.num_speculative_tokens, options.prompt_lookup
    cap = max(k, o.max_speculative_tokens)
    return Drafter("prompt_lookup", PromptLookupProposer(o.min_ngram, o.max_ngram), cap, cap, start_depth=k)


def _lookahead(options: StrategyOptions, models: Models) -> Drafter:
    o = options.lookahead
    proposer = LookaheadProposer(
        o.decoding_length, o.branch_length, o.max_query_length, o.mode, o.max_nodes, o.own_prompt_weight
    )
    return Drafter("lookahead", proposer, o.branch_length, o.decoding_length, trees=proposer.drafts_trees, learns=True)


def _medusa(options: StrategyOptions, models: Models) -> Drafter:
    o, heads = options.medusa, _need_heads(models, "medusa")
    problem = check_choices(o.choices, heads.num_heads, models.target.vocab_size)
    if problem is not None:
        raise ValueError(f"strategy.medusa.choices: {problem}")
    rule = Typical(o.typical_epsilon, o.typical_delta) if o.acceptance == "typical" else ExactMatch()
    depth = max(len(c) for c in o.choices)
    branching = len({tuple(c) for c in o.choices}) > depth
    return Drafter("medusa", HeadsProposer("medusa", heads, o.choices), depth, len(o.choices), rule, trees=branching)


def _blockwise(options: StrategyOptions, models: Models) -> Drafter:
    heads = _need_heads(models, "blockwise")
    k = min(options.num_speculative_tokens, heads.num_heads)
    top_k = options.blockwise.top_k
    rule = Relaxed(top_k) if top_k > 1 else ExactMatch()
    return Drafter("blockwise", HeadsProposer("blockwise", heads, chain_choices(k)), k, k, rule)


def _jacobi(options: StrategyOptions, models: Models) -> Drafter:
    o = options.jacobi
    depth = models.target.max_context if o.mode == "pj" else o.block_size
    proposer = JacobiProposer(o.mode, o.block_size, o.init)
    return Drafter("jacobi", proposer, depth, depth, greedy_only=True)


def _self_speculative(options: StrategyOptions, models: Models) -> Drafter:
    k = options.num_speculative_tokens
    o = options.self_speculative
    proposer = SelfSpeculativeProposer(
        models.target, _need_exits(models, "self_speculative"), o.exit_layer, o.min_confidence
    )
    return Drafter("self_speculative", proposer, k, k, RejectionSampling())


def _need_draft(models: Models, name: str) -> ModelRunner:
    found = models.get("draft")
    if found is None:
        raise ValueError(_missing_model(name, "draft"))
    return found


def _need_cmlm(models: Models, name: str) -> CMLM:
    found = models.get("cmlm")
    if found is None:
        raise ValueError(_missing_model(name, "cmlm"))
    return found


def _need_heads(models: Models, name: str) -> DraftHeads:
    found = models.get("heads")
    if found is None:
        raise ValueError(_missing_model(name, "heads"))
    return found


def _need_exits(models: Models, name: str) -> ExitHeads:
    found = models.get("exits")
    if found is None:
        raise ValueError(_missing_model(name, "exits"))
    return found


def _missing_model(name: str, model: str) -> str:
    return f"strategy {name} needs {_MODEL_ROLES[model]}: set model.{model}"


_DRAFTERS: dict[str, Callable[[StrategyOptions, Models], Drafter]] = {
    "speculative": _speculative,
    "specdec": _specdec,
    "prompt_lookup": _prompt_lookup,
    "lookahead": _lookahead,
    "medusa": _medusa,
    "blockwise": _blockwise,
    "jacobi": _jacobi,
    "self_speculative": _self_speculative,
}
NEEDS_HEADS = frozenset({"medusa", "blockwise"})
NEEDS_EXITS = frozenset({"self_speculative", CALM})
OPTIONAL_MODELS = ("draft", "heads", "exits", "cmlm")
_MODEL_ROLES = {
    "draft": "a draft model",
    "heads": "heads trained on the target",
    "exits": "exit heads trained on the target",
    "cmlm": "a conditional masked LM (accelgen train cmlm)",
}


def available() -> list[str]:
    return sorted([AUTOREGRESSIVE, AUTO, CALM, MASK_PREDICT, *_DRAFTERS])


def drafting() -> list[str]:
    """Strategies that draft and verify: what `auto` can choose among."""
    return sorted(_DRAFTERS)


def lossy_reason(name: str, options: StrategyOptions) -> str | None:
    """Why strategy `name` with these options may emit other tokens than the target would, or None."""
    if name == "specdec":
        return "SpecDec's relaxed verification (strategy.specdec)"
    if name == "medusa" and options.medusa.acceptance == "typical":
        return "Medusa's typical acceptance (strategy.medusa.acceptance=typical)"
    if name == "blockwise" and options.blockwise.top_k > 1:
        return f"blockwise top-{options.blockwise.top_k} acceptance (strategy.blockwise.top_k)"
    if name == CALM:
        return (
            "CALM's early exit (strategy.calm): a token may be an intermediate layer's guess, chosen where its "
            f"{options.calm.measure} confidence reached {options.calm.threshold}"
        )
    if name == MASK_PREDICT:
        return (
            "Mask-Predict (strategy.mask_predict): the conditional masked LM's parallel guesses, never checked "
            "against the target"
        )
    return None


def needs_models(name: str, options: StrategyOptions) -> set[str]:
    """Which optional models (`draft`, `heads`, `exits`, `cmlm`) strategy `name` uses; `auto` those of its
    `strategy.candidates`, or any when they are left to the models at hand."""
    if name == AUTO:
        if options.candidates:
            return set().union(*(needs_models(c, options) for c in options.candidates if c != AUTO))
        return set(OPTIONAL_MODELS)
    if name in ("speculative", "specdec"):
        return {"cmlm" if _drafter_of(name, options) == "cmlm" else "draft"}
    if name == MASK_PREDICT:
        return {"cmlm"}
    needs = {"heads": NEEDS_HEADS, "exits": NEEDS_EXITS}
    return {model for model, names in needs.items() if name in names}


def auto_candidates(options: StrategyOptions, has: set[str]) -> list[str]:
    """`strategy.candidates`, or every lossless drafting strategy whose models (`has`) are available."""
    if options.candidates:
        return list(options.candidates)
    return [n for n in drafting() if lossy_reason(n, options) is None and needs_models(n, options) <= has]


def missing_models(options: StrategyOptions, models: set[str]) -> list[str]:
    """The optional models strategy `options.name` needs that are not among `models` (those the job
    sets), each naming its key; `auto` uses what is there, so it misses none."""
    if options.name == AUTO:
        return []
    return [_missing_model(options.name, m) for m in sorted(needs_models(options.name, options) - models)]


def problems(options: StrategyOptions, greedy: bool, logprobs: bool = False) -> list[str]:
    """What is wrong with the strategy options for this job (`logprobs`: it reports the target's
    log-probabilities), each naming its key (empty: nothing)."""
    found = []
    if logprobs and options.name == CALM:
        found.append(LOGPROBS_REFUSAL)
    if logprobs and options.name == MASK_PREDICT:
        found.append(MASK_PREDICT_LOGPROBS_REFUSAL)
    if options.name not in available():
        found.append(f"strategy.name {options.name!r} is unknown; available: {', '.join(available())}")
    if options.name == AUTO and not options.adaptive:
        found.append("strategy.name=auto chooses per step with the controller: keep strategy.adaptive=true")
    unknown = sorted(set(options.candidates) - set(drafting()))
    if unknown:
        found.append(f"strategy.candidates {unknown} are unknown; available: {', '.join(drafting())}")
    found.extend(out_of_bounds(_bounds(options)))
    la, md, jc, cm = options.lookahead, options.medusa, options.jacobi, options.calm
    for key, value, allowed in (
        ("strategy.lookahead.mode", la.mode, MODES),
        ("strategy.medusa.acceptance", md.acceptance, MEDUSA_ACCEPTANCE),
        ("strategy.jacobi.mode", jc.mode, JACOBI_MODES),
        ("strategy.jacobi.init", jc.init, INITS),
        ("strategy.calm.measure", cm.measure, CALM_MEASURES),
        ("strategy.calm.batch_exit", cm.batch_exit, CALM_BATCH_EXITS),
        ("strategy.speculative.drafter", options.speculative.drafter, DRAFTERS),
        ("strategy.specdec.drafter", options.specdec.drafter, DRAFTERS),
    ):
        if value not in allowed:
            found.append(f"{key}={value!r}: use one of {', '.join(allowed)}")
    if not md.choices:
        found.append("strategy.medusa.choices is empty: give at least one path, e.g. [[0]]")
    else:
        shape = check_choices(md.choices)  # the heads' depth and the vocabulary are checked as the heads load
        if shape is not None:
            found.append(f"strategy.medusa.choices: {shape}")
    if options.name == MASK_PREDICT and not greedy:
        found.append(
            "strategy.name=mask_predict fills blocks with the CMLM's most likely tokens and has no sampling "
            "variant: use temperature 0"
        )
    relaxed = options.name == "specdec" or (options.name == "blockwise" and options.blockwise.top_k > 1)
    if relaxed and not greedy:
        reason = lossy_reason(options.name, options)
        found.append(f"strategy.name={options.name} uses {reason}, which relaxes greedy decoding: use temperature 0")
    return found


def _bounds(options: StrategyOptions) -> list[Bound]:
    """Every numeric strategy option's bounds."""
    sd, pl, la, md = options.specdec, options.prompt_lookup, options.lookahead, options.medusa
    ss, cm, mp = options.self_speculative, options.calm, options.mask_predict
    k = options.num_speculative_tokens
    return [
        ("strategy.num_speculative_tokens", k, k >= 0, ">= 0"),
        ("strategy.specdec.top_beta", sd.top_beta, sd.top_beta >= 1, ">= 1"),
        ("strategy.specdec.tolerance", sd.tolerance, sd.tolerance >= 0, ">= 0 (0 with top_beta=1: exact greedy)"),
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
        ("strategy.lookahead.decoding_length", la.decoding_length, la.decoding_length >= 1, ">= 1"),
        ("strategy.lookahead.branch_length", la.branch_length, la.branch_length >= 1, ">= 1"),
        ("strategy.lookahead.max_query_length", la.max_query_length, la.max_query_length >= 1, ">= 1"),
        ("strategy.lookahead.max_nodes", la.max_nodes, la.max_nodes >= 1, ">= 1"),
        ("strategy.lookahead.own_prompt_weight", la.own_prompt_weight, la.own_prompt_weight >= 0, ">= 0"),
        ("strategy.medusa.typical_epsilon", md.typical_epsilon, md.typical_epsilon > 0, "> 0"),
        ("strategy.medusa.typical_delta", md.typical_delta, md.typical_delta > 0, "> 0"),
        ("strategy.blockwise.top_k", options.blockwise.top_k, options.blockwise.top_k >= 1, ">= 1 (1: exact)"),
        ("strategy.jacobi.block_size", options.jacobi.block_size, options.jacobi.block_size >= 1, ">= 1"),
        ("strategy.self_speculative.exit_layer", ss.exit_layer, ss.exit_layer >= 1, ">= 1"),
        ("strategy.self_speculative.min_confidence", ss.min_confidence, 0 <= ss.min_confidence <= 1, "in [0, 1]"),
        ("strategy.calm.threshold", cm.threshold, cm.threshold > 0, "> 0"),
        ("strategy.calm.decay_tau", cm.decay_tau, cm.decay_tau >= 0, ">= 0 (0: a constant threshold)"),
        ("strategy.calm.min_layer", cm.min_layer, cm.min_layer >= 1, ">= 1"),
        ("strategy.mask_predict.iterations", mp.iterations, mp.iterations >= 1, ">= 1"),
        ("strategy.mask_predict.length_beam", mp.length_beam, mp.length_beam >= 1, ">= 1"),
        ("strategy.mask_predict.max_length", mp.max_length, mp.max_length >= 0, ">= 0 (0: the CMLM's own)"),
    ]


def create(options: StrategyOptions, models: Models, controller: Controller | None = None) -> Strategy:
    """The strategy `options.name`; drafting strategies run under `controller` when one is given."""
    name = options.name
    if name == AUTOREGRESSIVE:
        return AutoregressiveStrategy(models.target)
    if name == CALM:
        return CalmStrategy(models.target, _need_exits(models, CALM), options.calm)
    if name == MASK_PREDICT:
        return MaskPredictStrategy(_need_cmlm(models, MASK_PREDICT), options.mask_predict)
    if name == AUTO:
        if controller is None:
            raise ValueError("strategy 'auto' chooses per step: it needs the controller (strategy.adaptive=true)")
        has = models.available()
        names = auto_candidates(options, has)
        unknown = sorted(set(names) - set(_DRAFTERS))
        if unknown:
            raise KeyError(f"strategy.candidates {unknown} are unknown; available: {', '.join(drafting())}")
        return SpeculativeStrategy(AUTO, models.target, [_DRAFTERS[n](options, models) for n in names], controller)
    if name not in _DRAFTERS:
        raise KeyError(f"unknown strategy {name!r}; available: {', '.join(available())}")
    return SpeculativeStrategy(name, models.target, [_DRAFTERS[name](options, models)], controller)
