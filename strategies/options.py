"""Strategy options: the `strategy` section of a job's config, owned here beside the strategies.

Options of one strategy nest under its name (`strategy.specdec.top_beta`); options shared by
several strategies sit directly under `strategy` (`strategy.num_speculative_tokens`). Every field
carries its help text, which `accelgen generate --help` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecOptions:
    top_beta: int = field(
        default=3, metadata={"help": "SpecDec β: a draft token is acceptable if among the target's top-β tokens…"}
    )
    tolerance: float = field(
        default=1.0,
        metadata={"help": "…and its target logit is within this gap of the top-1 logit (β=1, 0: exact greedy)."},
    )


@dataclass
class StrategyOptions:
    name: str = field(
        default="autoregressive", metadata={"help": "Decoding strategy; an unknown name lists the available ones."}
    )
    num_speculative_tokens: int = field(
        default=4, metadata={"help": "Draft tokens proposed per step (chain length) by drafting strategies."}
    )
    specdec: SpecDecOptions = field(default_factory=SpecDecOptions)
