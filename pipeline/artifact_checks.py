"""Strategy options checked against the job's own trained artifacts, before anything is written.

Some options are valid alone but not with the artifacts the job points at: a Medusa path deeper than
the heads, a self-speculation exit layer the exits do not have, CALM's classifier measure with exits
trained without one. The actors refuse these as they build the strategy, but by then the job has
claimed its output folder, and a corrected rerun into it would be refused as a different job. For
local folders the driver reads the artifacts' small JSON records and refuses the job first.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import JobConfig
from strategies import registry
from strategies.artifacts.configs import read_exits_config, read_heads_config
from strategies.proposers.medusa_choices import check_choices
from workers.common.model_files import is_local, resolve_model_dir


def strategies_of(config: JobConfig) -> set[str]:
    """Every strategy that may decode a row of the job: any, when rows name their own."""
    options = config.strategy
    if config.input.strategy_column:
        return set(registry.available())
    if options.name == registry.AUTO:
        return set(options.candidates or registry.drafting())
    return {options.name}


def artifact_problems(config: JobConfig) -> list[str]:
    """What the job's strategy options ask of its local heads and exits that they cannot give."""
    used, options, found = strategies_of(config), config.strategy, []
    heads_dir = _local(config.model.heads, "heads.json")
    if heads_dir is not None and "medusa" in used:
        heads = read_heads_config(heads_dir)
        problem = check_choices(options.medusa.choices, heads.num_heads, heads.vocab_size)
        if problem is not None:
            found.append(f"strategy.medusa.choices: {problem} of model.heads={config.model.heads}")
    exits_dir = _local(config.model.exits, "exits.json")
    if exits_dir is not None:
        exits = read_exits_config(exits_dir)
        layer = options.self_speculative.exit_layer
        if "self_speculative" in used and layer not in exits.layers:
            found.append(
                f"strategy.self_speculative.exit_layer={layer}: model.exits={config.model.exits} has exits "
                f"after layers {exits.layers}; use one of them"
            )
        if "calm" in used and options.calm.measure == "classifier" and not exits.classifier:
            found.append(
                f"strategy.calm.measure=classifier: model.exits={config.model.exits} was trained without "
                "its confidence classifier (accelgen train exits exits.classifier=true); or use softmax, gap "
                "or state"
            )
    return found


def _local(url: str | None, marker: str) -> Path | None:
    if not url or not is_local(url):
        return None
    try:
        return resolve_model_dir(url, marker=marker, what="")
    except (ValueError, FileNotFoundError):
        return None  # the model kinds' own checks name a folder that is not what it should be
