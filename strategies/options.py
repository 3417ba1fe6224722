"""Strategy options: the `strategy` section of a job's config.

Options shared by several strategies sit directly under `strategy` (`strategy.num_speculative_tokens`,
`methods.spec.StrategySection`); each method's own nest under its name (`strategy.specdec.top_beta`),
declared in its module (`strategies/methods/<name>.py`) and gathered here in the registry's order, so
a new method's options join the section without this file changing. Every field carries its help
text, which `accelgen generate --help` prints.
"""

from __future__ import annotations

from dataclasses import field, make_dataclass

from strategies.methods.spec import StrategySection
from strategies.registry import SPECS

StrategyOptions = make_dataclass(
    "StrategyOptions",
    [(spec.name, spec.options, field(default_factory=spec.options)) for spec in SPECS if spec.options is not None],
    bases=(StrategySection,),
    # Found again by its module and name where a job's options are unpickled (Ray's actors).
    namespace={"__module__": __name__, "__doc__": "The `strategy` section: the shared options, then each method's."},
)
