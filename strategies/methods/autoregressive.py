"""Plain autoregressive decoding: one target forward per token, the baseline every method must equal
(greedy) or beat (`decoders/autoregressive.py`).
"""

from __future__ import annotations

from strategies.base import Strategy
from strategies.methods.spec import DecoderSpec, Models, StrategySection
from strategies.verification.control import AUTOREGRESSIVE

NAME = AUTOREGRESSIVE  # also what the controller calls a plain step


def decoder(options: StrategySection, models: Models) -> Strategy:
    from strategies.decoders.autoregressive import AutoregressiveStrategy

    return AutoregressiveStrategy(models.target)


SPEC = DecoderSpec(name=NAME, decoder=decoder)
