"""`auto`: the speculative loop with several drafters under the controller, which chooses per step
among them and plain autoregressive steps. Its options sit directly under `strategy`
(`candidates`, `allow_lossy_candidates`, `adaptive`); what it may choose among is every other
method's to say, so each function here is given the methods (`specs`, by name).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from strategies.base import Strategy
from strategies.methods.spec import DraftingSpec, Models, Spec, StrategySection, speculative_loop

if TYPE_CHECKING:
    from strategies.verification.control import Controller

NAME = "auto"


def drafting(specs: Mapping[str, Spec]) -> dict[str, DraftingSpec]:
    """The methods that draft and verify, in the order `auto` explores them where nothing tells their
    costs apart yet: the cheapest kind of drafting first (`DraftCost`), then as `specs` lists them."""
    drafters = [spec for spec in specs.values() if isinstance(spec, DraftingSpec)]
    return {spec.name: spec for spec in sorted(drafters, key=lambda spec: spec.cost)}


def lossy(options: StrategySection, specs: Mapping[str, Spec]) -> str | None:
    """Why `auto` may emit other tokens than the target would: its lossy `strategy.candidates` (only with
    `strategy.allow_lossy_candidates`)."""
    reasons = [f"{c}: {r}" for c in options.candidates if c in specs and (r := specs[c].lossy(options))]
    return f"auto chooses by timing among lossy candidates ({'; '.join(reasons)})" if reasons else None


def unreproducible(options: StrategySection, specs: Mapping[str, Spec]) -> str | None:
    """Why `auto`'s samples at temperature > 0 may change from run to run (`strategy.reproducible_sampling=
    false` with candidates that sample by rejection), or None."""
    if options.reproducible_sampling:
        return None
    names = options.candidates or [name for name, spec in drafting(specs).items() if spec.lossy(options) is None]
    rejecting = [c for c in names if c in specs and not specs[c].rule(options).keyed_samples]
    if not rejecting:
        return None
    return (
        f"auto may sample with {', '.join(rejecting)} by rejection sampling (strategy.reproducible_sampling=false): "
        "samples at temperature > 0 are exact in distribution but not reproducible from run to run"
    )


def needs(options: StrategySection, specs: Mapping[str, Spec]) -> set[str]:
    """The model kinds of its `strategy.candidates`, or any when they are left to the models at hand."""
    if options.candidates:
        return set().union(*(specs[c].models(options) for c in options.candidates if c in specs))
    return set().union(*(spec.models(options) for spec in specs.values()))


def candidates(options: StrategySection, specs: Mapping[str, Spec], has: set[str]) -> list[str]:
    """`strategy.candidates`, or every lossless drafting method whose models (`has`) are available, in
    exploration order (`drafting`)."""
    if options.candidates:
        return list(options.candidates)
    return [
        name
        for name, spec in drafting(specs).items()
        if spec.lossy(options) is None and set(spec.models(options)) <= has
    ]


def problems(options: StrategySection, specs: Mapping[str, Spec]) -> list[str]:
    """What is wrong with `auto`'s own options, each naming its key."""
    found = []
    if not options.adaptive:
        found.append("strategy.name=auto chooses per step with the controller: keep strategy.adaptive=true")
    known = sorted(drafting(specs))
    unknown = sorted(set(options.candidates) - set(known))
    if unknown:
        found.append(f"strategy.candidates {unknown} are unknown; available: {', '.join(known)}")
    lossy_ones = [c for c in options.candidates if c in known and specs[c].lossy(options) is not None]
    if lossy_ones and not options.allow_lossy_candidates:
        found.append(
            f"strategy.candidates {lossy_ones} are lossy: `auto` would choose among them by timing, so a row's "
            "tokens could change from run to run; drop them from strategy.candidates, or set "
            "strategy.allow_lossy_candidates=true to accept that"
        )
    return found


def build(
    options: StrategySection, models: Models, controller: Controller | None, specs: Mapping[str, Spec]
) -> Strategy:
    """The loop over its candidates' drafters, each once its options pass its checks."""
    if controller is None:
        raise ValueError("strategy 'auto' chooses per step: it needs the controller (strategy.adaptive=true)")
    names, known = candidates(options, specs, models.available()), drafting(specs)
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise KeyError(f"strategy.candidates {unknown} are unknown; available: {', '.join(sorted(known))}")
    drafters = []
    for name in names:
        found = known[name].check(options)
        if found:
            raise ValueError("; ".join(found))
        drafters.append(known[name].drafter(options, models))
    return speculative_loop(NAME, models.target, drafters, controller, options.reproducible_sampling)
