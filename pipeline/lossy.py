"""The manifest's `lossy`: each strategy of the job that may emit other tokens than the target would, and
why (empty: every row is the target's own output).

It follows the rows: the strategies a part's rows were decoded with are in the part's commit record
(`strategies`), so rows routed by `input.strategy_column` count as the job's own strategy does. Whether a
strategy is lossy is the registry's to say (`registry.lossy_reason`), from its acceptance rule or loop;
`auto` is lossy through its lossy `strategy.candidates`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from strategies import registry
from strategies.options import StrategyOptions


def lossy_strategies(options: StrategyOptions, used: Iterable[str] = ()) -> dict[str, str]:
    """The lossy ones among the job's strategy (`options.name`) and `used` (strategies that decoded rows),
    each with its reason."""
    reasons = {name: registry.lossy_reason(name, options) for name in sorted({options.name, *used})}
    return {name: reason for name, reason in reasons.items() if reason is not None}


def unreproducible_sampling(options: StrategyOptions, used: Iterable[str] = ()) -> dict[str, str]:
    """The job's strategies whose samples at temperature > 0 may differ from run to run, each with why:
    exact in distribution, not the target's keyed samples (`strategy.reproducible_sampling=false`)."""
    reasons = {name: registry.unreproducible_reason(name, options) for name in sorted({options.name, *used})}
    return {name: reason for name, reason in reasons.items() if reason is not None}


def strategies_of_parts(parts: Iterable[dict[str, Any]]) -> set[str]:
    """The strategies that decoded the rows of committed parts, from their commit records."""
    return {name for part in parts for name in part.get("strategies", [])}
