"""Strategy options checked against the job's own trained artifacts, before anything is written.

Some options are valid alone but not with the artifacts the job points at: a Medusa path deeper than
the heads, a self-speculation exit layer the exits do not have, CALM's classifier measure with exits
trained without one. The actors refuse these as they build the strategy, but by then the job has
claimed its output folder, and a corrected rerun into it would be refused as a different job. For
local folders the driver reads the artifacts' small JSON records, and each strategy the job may run
says what its options ask of them (`StrategySpec.artifact_check`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config import JobConfig
from strategies import registry
from strategies.artifacts.configs import read_exits_config, read_heads_config
from workers.common.model_files import is_local, resolve_model_dir
from workers.common.sections import ModelConfig

# The records a check may ask for, by model kind: the marker file of its folder, and its reader.
_RECORDS = {"heads": ("heads.json", read_heads_config), "exits": ("exits.json", read_exits_config)}


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
    return registry.artifact_problems(strategies_of(config), config.strategy, LocalArtifacts(config.model))


class LocalArtifacts:
    """The records of the job's `model.<kind>` folders that are local, each read once, when first asked."""

    def __init__(self, model: ModelConfig) -> None:
        self.model = model
        self.read: dict[str, tuple[str, Any] | None] = {}

    def record(self, kind: str) -> tuple[str, Any] | None:
        if kind not in self.read:
            url = getattr(self.model, kind)
            marker, reader = _RECORDS[kind]
            folder = _local(url, marker)
            self.read[kind] = None if folder is None else (url, reader(folder))
        return self.read[kind]


def _local(url: str | None, marker: str) -> Path | None:
    if not url or not is_local(url):
        return None
    try:
        return resolve_model_dir(url, marker=marker, what="")
    except (ValueError, FileNotFoundError):
        return None  # the model kinds' own checks name a folder that is not what it should be
