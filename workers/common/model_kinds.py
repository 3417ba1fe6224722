"""The optional models a job may set beside its target, one descriptor per kind: what is known of a
kind without loading it.

A kind's `ModelKind` holds its config key (`model.<name>`) and help, the file that marks its folder,
the reader of the target it was trained for, and the words that name its role. The config schema
(`pipeline/config.py`), the job's identity (`pipeline/fingerprint.py`), the job record's checks and
the worker spec iterate over `KINDS`; which kinds a strategy needs is the registry's to say, asked
through `needed_by` alone. Loading one needs torch and the target, so the actor's floor holds the
loaders (`workers.model_loading.LOADERS`, one per kind, checked against this table). A new kind is one
entry here, its loader there, and its own files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from strategies.artifacts.configs import read_eagle_config, read_exits_config, read_heads_config

if TYPE_CHECKING:
    from strategies.options import StrategyOptions


class TrainedFor(Protocol):
    """What a folder trained on one target records of it (`heads.json`, `exits.json`)."""

    target_path: str
    target_weights_sha256: str


@dataclass(frozen=True)
class ModelKind:
    name: str  # the config key (`model.<name>`), and the strategies' name for it (`Models.<name>`)
    role: str  # what it is, as an error names it: "strategy medusa needs {role}"
    help: str  # the config key's help text
    marker: str  # the file that marks a folder of this kind
    folder: str  # what such a folder is, for an error about a folder without the marker
    # Reads the target a folder was trained for: set, the folder is refused with other target weights
    # (before the job writes anything for local folders, by the actors for remote ones).
    trained_for: Callable[[Path], TrainedFor] | None = None

    @property
    def key(self) -> str:
        return f"model.{self.name}"


KINDS: tuple[ModelKind, ...] = (
    ModelKind(
        name="draft",
        role="a draft model",
        help="Draft model for speculative strategies (local directory or fsspec URL).",
        marker="config.json",
        folder="a Hugging Face model",
    ),
    ModelKind(
        name="heads",
        role="heads trained on the target",
        help="Draft heads trained on the target (`accelgen train heads`) for medusa and blockwise: folder or URL.",
        marker="heads.json",
        folder="a folder `accelgen train heads` wrote",
        trained_for=read_heads_config,
    ),
    ModelKind(
        name="exits",
        role="exit heads trained on the target",
        help="Exit heads at intermediate layers of the target (`accelgen train exits`) for self_speculative and "
        "calm: folder or URL.",
        marker="exits.json",
        folder="a `train exits` folder",
        trained_for=read_exits_config,
    ),
    ModelKind(
        name="cmlm",
        role="a conditional masked LM (accelgen train cmlm)",
        help="Conditional masked LM distilled from the target (`accelgen train cmlm`) for mask_predict, and for "
        "speculative/specdec with drafter=cmlm: folder or URL.",
        marker="cmlm.json",
        folder="a `train cmlm` folder",
    ),
    ModelKind(
        name="eagle",
        role="an EAGLE head trained on the target (accelgen train eagle)",
        help="EAGLE draft head trained on the target's features (`accelgen train eagle`) for strategy eagle: "
        "folder or URL.",
        marker="eagle.json",
        folder="a `train eagle` folder",
        trained_for=read_eagle_config,
    ),
)
BY_NAME: dict[str, ModelKind] = {kind.name: kind for kind in KINDS}


def needed_by(options: StrategyOptions, any_strategy: bool = False) -> set[str]:
    """The kinds strategy `options.name` may use (`auto`: those of its candidates, or every kind when
    they are left to the models at hand); every kind when rows may name any strategy (`any_strategy`:
    `input.strategy_column` is set)."""
    from strategies import registry

    if any_strategy:
        return set(BY_NAME)
    return registry.needs_models(options.name, options)


def missing_models(options: StrategyOptions, model: Any) -> list[str]:
    """What strategy `options.name` needs of the kinds the `model` config section leaves unset, each
    naming its key; `auto` decodes with the kinds at hand, so it misses none."""
    from strategies import registry

    if options.name == registry.AUTO:
        return []
    unset = needed_by(options) - {kind.name for kind in KINDS if getattr(model, kind.name)}
    return [f"strategy {options.name} needs {BY_NAME[n].role}: set {BY_NAME[n].key}" for n in sorted(unset)]
