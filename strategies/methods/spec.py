"""What a method module declares (`DraftingSpec`, `DecoderSpec`), what it reads of the options
(`StrategySection`), and what its builders are given (`Models`).

Every drafting method is the speculative loop (`strategies.verification.speculative`) with one
drafter: a proposer, its limits and the acceptance rule it is verified with (`rules.py`, applied by
`acceptance.py` through `verify.py`). Such a method is lossless exactly when its rule under the
options is (`AcceptanceRule.lossless`), and samples exactly where its rule can, so `DraftingSpec`
derives both from the rule and no table of names can disagree with the rule that runs. A method with
a loop of its own (`DecoderSpec`) says both itself.

A job's driver reads these declarations before Ray's actors load anything and imports no torch (a
cold job's Ray start shares the machine's cores with the driver's imports). So everything here is
torch-free, and a builder (`DraftingSpec.drafting`, `DecoderSpec.decoder`), which runs in the actor,
imports its method's runtime code inside itself.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Protocol

from strategies.base import OutputColumns, Strategy
from strategies.config_option import option
from strategies.verification.drafting import DraftingMethod
from strategies.verification.rules import AcceptanceRule, ExactMatch

if TYPE_CHECKING:
    from strategies.runtime.runner import ModelRunner
    from strategies.verification.control import Controller


@dataclass
class StrategySection:
    """The `strategy` config section as the methods read it: the options several methods share, directly
    under `strategy`. Each method's own section is an attribute named after the method, which
    `strategies.options.StrategyOptions` adds: it gathers the sections from the methods, so they read
    the section through this base."""

    name: str = option("autoregressive", "Decoding strategy; an unknown name lists the available ones.")
    num_speculative_tokens: int = option(4, "Draft tokens proposed per step (chain length) by drafting strategies.")
    adaptive: bool = option(True, "Let the controller turn speculation off where it does not pay and size drafts.")
    adaptive_growth: float = option(
        2.0,
        "How far beyond its configured size the controller may grow a drafter's drafts where its cost model "
        "says a wider verify pays (a large target, whose verify forward over 16 tokens costs about a plain "
        "step): a chain to growth × its length (strategy.num_speculative_tokens; strategy.eagle.depth with "
        "tree=chain), a tree to growth × its nodes (strategy.eagle.nodes, strategy.lookahead.decoding_length). "
        "The configured sizes are where the controller starts and what a strategy without it drafts "
        "(strategy.adaptive=false). Medusa's tree and prompt lookup's max_speculative_tokens are bounds "
        "already. 1: no growth.",
    )
    candidates: list[str] = option(
        [], "Drafting strategies `auto` chooses among. Empty: every lossless one whose models exist."
    )
    allow_lossy_candidates: bool = option(
        False,
        "Let strategy.candidates name lossy strategies (specdec, medusa with typical acceptance, "
        "blockwise top-k). `auto` picks them by timing, so a row's tokens may differ from run to run.",
    )
    reproducible_sampling: bool = option(
        True,
        "At temperature > 0, `auto` drafts only with candidates that emit the target's keyed samples, so a rerun "
        "samples the same tokens. false: rejection-sampling candidates too (self_speculative, speculative with a "
        "draft model): exact in distribution, but a row's samples depend on the drafter `auto` picked by timing.",
    )

    if TYPE_CHECKING:

        def __getattr__(self, section: str) -> Any: ...


def grown(size: int, options: StrategySection) -> int:
    """The largest draft the controller may size one configured at `size` to (`strategy.adaptive_growth`):
    sizes chosen for a small target, where a wide verify forward costs several plain steps, would hold a
    large one, where it costs about one, to drafts far shorter than pay."""
    return max(size, math.ceil(size * options.adaptive_growth))


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


def need(models: Models, kind: str, strategy: str) -> Any:
    """The optional model of `kind` for `strategy`, or an error naming its key. A job asks for its
    strategies' models before it starts (`workers.common.model_kinds.missing_models`), so this is the last
    word of a direct caller that did not."""
    found = models.get(kind)
    if found is None:
        raise ValueError(f"strategy {strategy} needs a model of kind {kind}, and none was given: set model.{kind}")
    return found


class Artifacts(Protocol):
    """The job's trained artifacts as the driver sees them before anything is written."""

    def record(self, kind: str) -> tuple[str, Any] | None:
        """`model.<kind>`'s URL and its small JSON record (heads.json, exits.json), where it is a local
        folder that has one; None otherwise (nothing to check against)."""


class DraftCost(IntEnum):
    """What a drafter runs for its drafts. Where nothing tells the candidates' costs apart yet, `auto`
    explores the cheaper kinds first."""

    LOOKUP = 0  # no model: text copied from the context or a trie
    HEADS = 1  # small heads on the target's last state
    GUESSES = 2  # guesses refined by the verify forwards themselves, accepted little until they converge
    MODEL = 3  # a model forward per draft token


OptionsCheck = Callable[["StrategySection"], list[str]]
ArtifactCheck = Callable[["StrategySection", Artifacts], list[str]]


def no_problems(options: StrategySection) -> list[str]:
    return []


def no_artifact_problems(options: StrategySection, artifacts: Artifacts) -> list[str]:
    return []


def exact_match(options: StrategySection) -> AcceptanceRule:
    """The rule of a drafter whose drafts are kept only where the target chose them."""
    return ExactMatch()


@dataclass(frozen=True, kw_only=True)
class StrategySpec:
    """What every method declares. `options`: its section (`strategy.<name>.*`), None if it has none.
    `needs`: the model kinds it uses (`model.<kind>` keys), or a function of its options giving them.
    `check`: what is wrong with its own options, each naming its key; checked for every job, since a
    strategy column may name any strategy. `artifact_check`: what its options ask of the job's local
    artifacts that they cannot give (`pipeline.artifact_checks`). `output_columns`: the columns it
    fills for its rows (`strategies.base.OutputColumns`). `controls_refusal`: why it cannot apply the
    sampling controls (penalties, min_p, min_tokens, stop token ids, logit bias), or None: it applies
    them wherever it chooses a token (`strategies.runtime.logit_controls`)."""

    name: str
    options: type | None = None
    needs: tuple[str, ...] | Callable[[StrategySection], tuple[str, ...]] = ()
    check: OptionsCheck = no_problems
    controls_refusal: str | None = None
    artifact_check: ArtifactCheck = no_artifact_problems
    output_columns: OutputColumns = field(default_factory=dict)

    def models(self, options: StrategySection) -> tuple[str, ...]:
        """The model kinds it uses under these options."""
        return self.needs if isinstance(self.needs, tuple) else self.needs(options)


@dataclass(frozen=True, kw_only=True)
class DraftingSpec(StrategySpec):
    """A drafter in the speculative loop. `rule`: the acceptance rule it is verified with under the
    options, which alone decides whether it is lossless and whether it can sample. `drafting`: its
    builder, the drafter from loaded models and that rule. `cost`: where `auto` explores it."""

    cost: DraftCost
    drafting: Callable[[StrategySection, Models, AcceptanceRule], DraftingMethod]
    rule: Callable[[StrategySection], AcceptanceRule] = exact_match

    def lossy(self, options: StrategySection) -> str | None:
        """Why it may emit other tokens than the target would, or None."""
        verifier = self.rule(options)
        if verifier.lossless:
            return None
        return (
            f"{verifier.name} acceptance ({verifier!r}, strategy.{self.name}) may keep tokens the target would "
            "not choose"
        )

    def refusal(self, options: StrategySection, greedy: bool, logprobs: bool) -> str | None:
        """Why it cannot decode rows of this job (greedy or not, log-probabilities asked or not), or None."""
        refused = self.rule(options).refusal(greedy, trees=False)
        return None if refused is None else f"strategy.name={self.name}: {refused}"

    def drafter(self, options: StrategySection, models: Models) -> DraftingMethod:
        """The drafter, as its own strategy and as one of `auto`'s, runs it."""
        return self.drafting(options, models, self.rule(options))

    def build(self, options: StrategySection, models: Models, controller: Controller | None) -> Strategy:
        """The speculative loop with this one drafter, under `controller` when one is given."""
        return speculative_loop(self.name, models.target, [self.drafter(options, models)], controller)


def lossless(options: StrategySection) -> str | None:
    return None


def refuses_nothing(options: StrategySection, greedy: bool, logprobs: bool) -> str | None:
    return None


@dataclass(frozen=True, kw_only=True)
class DecoderSpec(StrategySpec):
    """A method with a loop of its own. `decoder`: its builder, from loaded models. `lossy`: why it may
    emit other tokens than the target would, or None. `refusal`: why it cannot decode rows of this job
    (greedy or not, log-probabilities asked or not), or None."""

    decoder: Callable[[StrategySection, Models], Strategy]
    lossy: Callable[[StrategySection], str | None] = lossless
    refusal: Callable[[StrategySection, bool, bool], str | None] = refuses_nothing

    def build(self, options: StrategySection, models: Models, controller: Controller | None) -> Strategy:
        """Its loop; the controller plans drafting steps, which it has none of."""
        return self.decoder(options, models)


Spec = DraftingSpec | DecoderSpec


def speculative_loop(
    name: str,
    target: ModelRunner,
    drafters: list[DraftingMethod],
    controller: Controller | None,
    keyed_samples_only: bool = False,
) -> Strategy:
    """The speculative loop over `drafters` (several: `auto`'s), built in the actor; `keyed_samples_only`:
    rows sampled at temperature > 0 draft only with drafters whose rule emits the target's keyed samples."""
    from strategies.verification.speculative import SpeculativeStrategy

    return SpeculativeStrategy(name, target, drafters, controller, keyed_samples_only)
