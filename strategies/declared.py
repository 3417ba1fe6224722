"""What strategies say of themselves that a job must know before any model loads: the chain drafters
`strategy.speculative.drafter` and `strategy.specdec.drafter` name, and the output columns and
log-probability refusals of the decoders with loops of their own. The registry reads these in the
driver, which imports no torch (a cold job's Ray start shares the cores with the driver's imports);
the classes that run them take their attributes from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import OutputColumns


@dataclass(frozen=True)
class ChainDrafter:
    """A model that drafts a chain token by token, as a `strategy.<name>.drafter` value."""

    name: str  # the `drafter` value
    model: str  # the `model.<kind>` it drafts with
    draft_probabilities: bool  # drafts carry q, as speculative sampling needs


DRAFT_MODEL = ChainDrafter("draft_model", model="draft", draft_probabilities=True)
CMLM_DRAFTER = ChainDrafter("cmlm", model="cmlm", draft_probabilities=False)

CALM_OUTPUT_COLUMNS: OutputColumns = {"mean_exit_layer": float}  # the row's mean exit layer
CALM_LOGPROBS_REFUSAL = (
    "strategy calm chooses tokens at intermediate layers and never runs the target's full forward for "
    "them, so it has no target log-probabilities to report: use a lossless strategy, or drop "
    "output.logprobs and output.top_logprobs"
)

# The CMLM passes the row took, all blocks together; the length chosen for each of its blocks.
MASK_PREDICT_OUTPUT_COLUMNS: OutputColumns = {"iterations": int, "block_lengths": list[int]}
MASK_PREDICT_LOGPROBS_REFUSAL = (
    "strategy mask_predict never runs the target, so it has no target log-probabilities to report: use a "
    "lossless strategy, or drop output.logprobs and output.top_logprobs"
)
