"""Every decoding method, listed once, and what a job asks of them by name. Each method is one module
of `strategies/methods/` declaring its options section, their checks, the models it needs, its
artifact checks, output columns, refusals and builder (`spec.StrategySpec`); a new method is that
module, its proposer or decoder, and one line in `SPECS`. An unknown name fails loudly with the list
of known ones.

`SPECS`' order is the `strategy` config section's (`strategies.options`) and that in which the
methods' option checks are reported; `auto` explores its drafters by their kind of drafting
(`methods.auto.drafting`). Everything here is torch-free: the job's driver reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.base import OutputColumns, Strategy
from strategies.config_bounds import out_of_bounds
from strategies.methods import (
    auto,
    autoregressive,
    blockwise,
    calm,
    eagle,
    jacobi,
    lookahead,
    mask_predict,
    medusa,
    prompt_lookup,
    self_speculative,
    specdec,
    speculative,
)
from strategies.methods.spec import Artifacts, Models, Spec, StrategySection

if TYPE_CHECKING:
    from strategies.verification.control import Controller

SPECS: tuple[Spec, ...] = (
    autoregressive.SPEC,
    speculative.SPEC,
    specdec.SPEC,
    prompt_lookup.SPEC,
    lookahead.SPEC,
    medusa.SPEC,
    blockwise.SPEC,
    eagle.SPEC,
    jacobi.SPEC,
    self_speculative.SPEC,
    calm.SPEC,
    mask_predict.SPEC,
)
_SPECS: dict[str, Spec] = {spec.name: spec for spec in SPECS}

AUTO = auto.NAME
MASK_PREDICT = mask_predict.NAME


def available() -> list[str]:
    return sorted([AUTO, *_SPECS])


def drafting() -> list[str]:
    """Strategies that draft and verify: what `auto` can choose among."""
    return sorted(auto.drafting(_SPECS))


def output_columns() -> OutputColumns:
    """Every output column a strategy declares (name -> Python type of its values), in `SPECS` order."""
    return {column: kind for spec in SPECS for column, kind in spec.output_columns.items()}


def lossy_reason(name: str, options: StrategySection) -> str | None:
    """Why strategy `name` with these options may emit other tokens than the target would, or None;
    `auto` is lossy through its lossy `strategy.candidates` (only with `strategy.allow_lossy_candidates`)."""
    if name == AUTO:
        return auto.lossy(options, _SPECS)
    spec = _SPECS.get(name)
    return None if spec is None else spec.lossy(options)


def unreproducible_reason(name: str, options: StrategySection) -> str | None:
    """Why strategy `name`'s samples at temperature > 0 may differ between runs of the same job, or None:
    only `auto` that may pick a rejection-sampling candidate by timing."""
    return auto.unreproducible(options, _SPECS) if name == AUTO else None


def needs_models(name: str, options: StrategySection) -> set[str]:
    """Which optional model kinds strategy `name` uses; `auto` those of its
    `strategy.candidates`, or any when they are left to the models at hand."""
    if name == AUTO:
        return auto.needs(options, _SPECS)
    spec = _SPECS.get(name)
    return set() if spec is None else set(spec.models(options))


def models_needed(options: StrategySection) -> set[str]:
    """The model kinds (`model.<kind>` keys) the strategy `options.name` uses under its options."""
    return needs_models(options.name, options)


def auto_candidates(options: StrategySection, has: set[str]) -> list[str]:
    """`strategy.candidates`, or every lossless drafting strategy whose models (`has`) are available,
    cheapest drafting first."""
    return auto.candidates(options, _SPECS, has)


def problems(
    options: StrategySection, greedy: bool, logprobs: bool = False, controls: bool = False, formats: bool = False
) -> list[str]:
    """What is wrong with the strategy options for this job (`logprobs`: it reports the target's
    log-probabilities; `controls`: it sets sampling controls; `formats`: a response_format), each
    naming its key (empty: nothing).
    Every strategy's own options are checked, since a strategy column may name any of them."""
    found = []
    name = options.name
    if name not in available():
        found.append(f"strategy.name {name!r} is unknown; available: {', '.join(available())}")
    elif name == AUTO:
        found.extend(auto.problems(options, _SPECS))
    else:
        refused = _SPECS[name].refusal(options, greedy, logprobs)
        found.extend([refused] if refused else [])
        if controls and _SPECS[name].controls_refusal:
            found.append(_SPECS[name].controls_refusal)
    if formats and name in available():
        found.extend([refused] if (refused := format_refusal(options)) else [])
    k = options.num_speculative_tokens
    growth = options.adaptive_growth
    found.extend(
        out_of_bounds(
            [
                ("strategy.num_speculative_tokens", k, k >= 0, ">= 0"),
                ("strategy.adaptive_growth", growth, growth >= 1, ">= 1 (1: the configured sizes are the bounds)"),
            ]
        )
    )
    for spec in SPECS:
        found.extend(spec.check(options))
    return found


def format_refusal(options: StrategySection) -> str | None:
    """Why strategy `options.name` cannot keep rows inside a response_format, or None: a lossy one may keep
    a token the grammar's mask ruled out, and one that refuses sampling controls chooses tokens where no
    mask reaches."""
    name = options.name
    spec = _SPECS.get(name)
    why = auto.lossy(options, _SPECS) if spec is None else spec.controls_refusal or spec.lossy(options)
    if why is None:
        return None
    return (
        f"strategy.name={name} cannot keep rows inside a response_format ({why}): use a lossless strategy "
        "(autoregressive, auto, or a drafter with exact acceptance), or drop the row's response_format"
    )


def artifact_problems(names: set[str], options: StrategySection, artifacts: Artifacts) -> list[str]:
    """What the options of strategies `names` ask of the job's local artifacts that they cannot give."""
    return [problem for spec in SPECS if spec.name in names for problem in spec.artifact_check(options, artifacts)]


def create(options: StrategySection, models: Models, controller: Controller | None = None) -> Strategy:
    """The strategy `options.name`, once its options pass its checks (the constructors do not repeat
    them); drafting strategies run under `controller` when one is given."""
    name = options.name
    if name == AUTO:
        return auto.build(options, models, controller, _SPECS)
    if name not in _SPECS:
        raise KeyError(f"unknown strategy {name!r}; available: {', '.join(available())}")
    spec = _SPECS[name]
    found = spec.check(options)
    if found:
        raise ValueError("; ".join(found))
    return spec.build(options, models, controller)
