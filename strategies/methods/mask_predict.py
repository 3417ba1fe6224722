"""Mask-Predict (Ghazvininejad et al. 2019): a conditional masked LM fills blocks of the output in a few
parallel passes (`decoders/mask_predict.py`). The target never runs: lossy, greedy only, and never
among `auto`'s candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import OutputColumns, Strategy
from strategies.config_bounds import out_of_bounds
from strategies.config_option import option
from strategies.methods.spec import DecoderSpec, Models, StrategySection, need

NAME = "mask_predict"
# The CMLM passes the row took, all blocks together; the length chosen for each of its blocks.
MASK_PREDICT_OUTPUT_COLUMNS: OutputColumns = {"iterations": int, "block_lengths": list[int]}
MASK_PREDICT_LOGPROBS_REFUSAL = (
    "strategy mask_predict never runs the target, so it has no target log-probabilities to report: use a "
    "lossless strategy, or drop output.logprobs and output.top_logprobs"
)


@dataclass
class MaskPredictOptions:
    iterations: int = option(
        10,
        "T: passes of the CMLM per block. Pass t >= 1 re-masks the N·(T−t)/T least confident tokens and "
        "predicts them again.",
    )
    length_beam: int = option(
        1,
        "l: the l most likely block lengths are each decoded; the one of highest mean log-probability "
        "is kept (costs l times the compute).",
    )
    max_length: int = option(
        0,
        "Longest block, in tokens (0: the CMLM's own, cmlm.json max_length). Longer outputs are decoded "
        "block after block, each conditioned on the ones before.",
    )


def decoder(options: StrategySection, models: Models) -> Strategy:
    from strategies.decoders.mask_predict import MaskPredictStrategy

    return MaskPredictStrategy(need(models, "cmlm", NAME), options.mask_predict)


def lossy(options: StrategySection) -> str:
    return (
        "Mask-Predict (strategy.mask_predict): the conditional masked LM's parallel guesses, never checked "
        "against the target"
    )


def refusal(options: StrategySection, greedy: bool, logprobs: bool) -> str | None:
    if logprobs:
        return MASK_PREDICT_LOGPROBS_REFUSAL
    if not greedy:
        return (
            "strategy.name=mask_predict fills blocks with the CMLM's most likely tokens and has no sampling "
            "variant: use temperature 0"
        )
    return None


def check(options: StrategySection) -> list[str]:
    mp = options.mask_predict
    return out_of_bounds(
        [
            ("strategy.mask_predict.iterations", mp.iterations, mp.iterations >= 1, ">= 1"),
            ("strategy.mask_predict.length_beam", mp.length_beam, mp.length_beam >= 1, ">= 1"),
            ("strategy.mask_predict.max_length", mp.max_length, mp.max_length >= 0, ">= 0 (0: the CMLM's own)"),
        ]
    )


SPEC = DecoderSpec(
    name=NAME,
    options=MaskPredictOptions,
    needs=("cmlm",),
    decoder=decoder,
    lossy=lossy,
    refusal=refusal,
    check=check,
    output_columns=MASK_PREDICT_OUTPUT_COLUMNS,
    controls_refusal=(
        "strategy.name=mask_predict fills blocks with the CMLM's guesses and never reads the target's logits, "
        "so it cannot apply sampling controls (penalties, min_p, min_tokens, stop_token_ids, logit_bias): drop "
        "them or use another strategy"
    ),
)
