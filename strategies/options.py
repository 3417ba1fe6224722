"""Strategy options: the `strategy` section of a job's config.

Options shared by several strategies sit directly under `strategy` (`strategy.num_speculative_tokens`,
`SharedOptions`); each method's own nest under its name (`strategy.specdec.top_beta`), declared in its
module (`strategies/methods/<name>.py`) and gathered here in the registry's order, so a new method's
options join the section without this file changing. Every field carries its help text, which
`accelgen generate --help` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass

from strategies.config_option import option
from strategies.registry import SPECS


@dataclass
class SharedOptions:
    name: str = option("autoregressive", "Decoding strategy; an unknown name lists the available ones.")
    num_speculative_tokens: int = option(4, "Draft tokens proposed per step (chain length) by drafting strategies.")
    adaptive: bool = option(True, "Let the controller turn speculation off where it does not pay and size drafts.")
    candidates: list[str] = option(
        [], "Drafting strategies `auto` chooses among. Empty: every lossless one whose models exist."
    )
    allow_lossy_candidates: bool = option(
        False,
        "Let strategy.candidates name lossy strategies (specdec, medusa with typical acceptance, "
        "blockwise top-k). `auto` picks them by timing, so a row's tokens may differ from run to run.",
    )


StrategyOptions = make_dataclass(
    "StrategyOptions",
    [(spec.name, spec.options, field(default_factory=spec.options)) for spec in SPECS if spec.options is not None],
    bases=(SharedOptions,),
    # Found again by its module and name where a job's options are unpickled (Ray's actors).
    namespace={"__module__": __name__, "__doc__": "The `strategy` section: the shared options, then each method's."},
)
