"""Plain autoregressive decoding: one target forward per token, the baseline every method must equal
(greedy) or beat (`decoders/autoregressive.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.base import Strategy
from strategies.methods.spec import DecoderSpec, Models
from strategies.verification.control import AUTOREGRESSIVE

if TYPE_CHECKING:
    from strategies.options import StrategyOptions

NAME = AUTOREGRESSIVE  # also what the controller calls a plain step


def decoder(options: StrategyOptions, models: Models) -> Strategy:
    from strategies.decoders.autoregressive import AutoregressiveStrategy

    return AutoregressiveStrategy(models.target)


SPEC = DecoderSpec(name=NAME, decoder=decoder)
