"""CALM (Schuster et al. 2022): each token leaves the target at the first layer whose exit is
confident enough (`decoders/calm.py`). Lossy; never among `auto`'s candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import OutputColumns, Strategy
from strategies.config_bounds import one_of, out_of_bounds
from strategies.config_option import option
from strategies.methods.spec import Artifacts, DecoderSpec, Models, StrategySection, need

NAME = "calm"
CALM_MEASURES = ("softmax", "gap", "state", "classifier")
CALM_BATCH_EXITS = ("row", "batch")
CALM_OUTPUT_COLUMNS: OutputColumns = {"mean_exit_layer": float}  # the row's mean exit layer
CALM_LOGPROBS_REFUSAL = (
    "strategy calm chooses tokens at intermediate layers and never runs the target's full forward for "
    "them, so it has no target log-probabilities to report: use a lossless strategy, or drop "
    "output.logprobs and output.top_logprobs"
)


@dataclass
class CalmOptions:
    threshold: float = option(
        0.8,
        "λ: exit after a layer once its confidence reaches λ_t = λ·(0.9 + 0.1·exp(−τ·t/N)) (decay_tau). "
        "Every measure's confidence is at most 1 and can be exactly 1, and λ_t falls towards λ·(0.9 + "
        "0.1·exp(−τ)) late in the output, so λ just above 1 still exits late tokens; λ ≥ 1/(0.9 + "
        "0.1·exp(−τ)) never exits (the target's own greedy output): 1.1089 at τ = 4, 1 at τ = 0. "
        "The default (with measure softmax) is the shipped exits' calibrated setting: the shallowest mean "
        "exit layer keeping 95% of tokens equal to the full model's greedy choice on training-split "
        "prompts (96.5% on the held-out half), from `accelgen calibrate calm "
        "jobs/configs/calibrate_calm.yaml`; calibrate again for other exits or prompts.",
    )
    measure: str = option(
        "softmax",
        f"One of {CALM_MEASURES}: the exit's top probability, its top-1 minus top-2 probability, the "
        "cosine between the states before and after the layer, or the exits' trained classifier. The "
        "default is calibrated with threshold (see strategy.calm.threshold).",
    )
    decay_tau: float = option(
        4.0, "Threshold at output token t of N: λ·(0.9 + 0.1·exp(−τ·t/N)), as in CALM. 0: constant."
    )
    min_layer: int = option(1, "Exits before this many layers are never taken.")
    batch_exit: str = option(
        "row",
        f"One of {CALM_BATCH_EXITS}. row: each row exits at its own layer (exited rows skip the layers' "
        "MLP); batch: the whole batch exits together once every row passes (CALM's reference rule).",
    )


def decoder(options: StrategySection, models: Models) -> Strategy:
    from strategies.decoders.calm import CalmStrategy

    return CalmStrategy(models.target, need(models, "exits", NAME), options.calm)


def lossy(options: StrategySection) -> str:
    return (
        "CALM's early exit (strategy.calm): a token may be an intermediate layer's guess, chosen where its "
        f"{options.calm.measure} confidence reached {options.calm.threshold}"
    )


def refusal(options: StrategySection, greedy: bool, logprobs: bool) -> str | None:
    return CALM_LOGPROBS_REFUSAL if logprobs else None


def check(options: StrategySection) -> list[str]:
    cm = options.calm
    return (
        one_of("strategy.calm.measure", cm.measure, CALM_MEASURES)
        + one_of("strategy.calm.batch_exit", cm.batch_exit, CALM_BATCH_EXITS)
        + out_of_bounds(
            [
                ("strategy.calm.threshold", cm.threshold, cm.threshold > 0, "> 0"),
                ("strategy.calm.decay_tau", cm.decay_tau, cm.decay_tau >= 0, ">= 0 (0: a constant threshold)"),
                ("strategy.calm.min_layer", cm.min_layer, cm.min_layer >= 1, ">= 1"),
            ]
        )
    )


def artifact_check(options: StrategySection, artifacts: Artifacts) -> list[str]:
    """The classifier measure with local exits trained without one."""
    found = artifacts.record("exits")
    if options.calm.measure != "classifier" or found is None or found[1].classifier:
        return []
    return [
        f"strategy.calm.measure=classifier: model.exits={found[0]} was trained without its confidence "
        "classifier (accelgen train exits exits.classifier=true); or use softmax, gap or state"
    ]


SPEC = DecoderSpec(
    name=NAME,
    options=CalmOptions,
    needs=("exits",),
    decoder=decoder,
    lossy=lossy,
    refusal=refusal,
    check=check,
    artifact_check=artifact_check,
    output_columns=CALM_OUTPUT_COLUMNS,
)
