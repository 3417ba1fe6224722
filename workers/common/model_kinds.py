"""The optional models a job may set beside its target, one descriptor per kind, and their loading.

Everything the project knows of a kind lives in its `ModelKind`: the config key (`model.<name>`) and
its help, the file that marks its folder, the check that it fits the target (trained for the
target's weights, or sharing its vocabulary), its loader, and the words that name its role. The
config schema (`pipeline/config.py`), the job's identity (`pipeline/fingerprint.py`), the job
record's checks, the worker spec and the actors' loading all iterate over `KINDS`; which kinds a
strategy needs is the registry's to say, asked through `needed_by` alone. A new kind is one entry
here and its own files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from strategies.artifacts.configs import read_eagle_config, read_exits_config, read_heads_config

if TYPE_CHECKING:
    from strategies.artifacts.cmlm import CMLM
    from strategies.artifacts.eagle import EagleHead
    from strategies.artifacts.exits import ExitHeads
    from strategies.artifacts.heads import DraftHeads
    from strategies.options import StrategyOptions
    from strategies.runtime.runner import ModelRunner
    from workers.model_loading import Loading


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
    load: Callable[[Path, str, Loading], Any]  # (local folder, its URL, the job's loading) -> the model, checked
    # Reads the target a folder was trained for: set, the folder is refused with other target weights
    # (before the job writes anything for local folders, by the actors for remote ones).
    trained_for: Callable[[Path], TrainedFor] | None = None

    @property
    def key(self) -> str:
        return f"model.{self.name}"


# The loaders import what they load with only when called: the config schema reads this table, and
# `accelgen --help` should not wait for torch.


def _load_draft(folder: Path, url: str, at: Loading) -> ModelRunner:
    from strategies.runtime.runner import ModelRunner
    from workers.model_loading import load_model

    model, tokenizer = load_model(folder, at.dtype, at.device, at.trust_remote_code)
    if tokenizer.get_vocab() != at.tokenizer.get_vocab():
        raise ValueError(
            f"model.draft {url} has a different tokenizer than model.target {at.target_url}: "
            "a draft must share the target's vocabulary"
        )
    runner = ModelRunner(model)
    runner.prepack()  # loaded as its strategy is made, before decoding: not on its first draft
    return runner


def _load_heads(folder: Path, url: str, at: Loading) -> DraftHeads:
    from strategies.artifacts.heads import load_heads

    loaded = load_heads(folder, at.dtype, at.device)
    loaded.use_lm_head(at.target.get_output_embeddings().weight)
    return loaded


def _heads_trained_for(folder: Path) -> TrainedFor:
    return read_heads_config(folder)


def _load_exits(folder: Path, url: str, at: Loading) -> ExitHeads:
    from strategies.artifacts.exits import load_exits

    loaded = load_exits(folder, at.dtype, at.device)
    loaded.use_lm_head(at.target.get_output_embeddings().weight)
    return loaded


def _exits_trained_for(folder: Path) -> TrainedFor:
    return read_exits_config(folder)


def _load_cmlm(folder: Path, url: str, at: Loading) -> CMLM:
    from strategies.artifacts.cmlm import CMLM, read_config
    from strategies.runtime.runner import ModelRunner
    from workers.model_loading import check_extends_vocabulary, load_model

    model, tokenizer = load_model(folder, at.dtype, at.device, at.trust_remote_code)
    check_extends_vocabulary(tokenizer, at.tokenizer, f"model.cmlm {url}", f"model.target {at.target_url}")
    runner = ModelRunner(model)
    runner.prepack()  # as the draft model's: before decoding, not on its first draft
    return CMLM(runner, read_config(folder))


def _load_eagle(folder: Path, url: str, at: Loading) -> EagleHead:
    from strategies.artifacts.eagle import load_eagle

    loaded = load_eagle(folder, at.dtype, at.device)
    loaded.use_target(at.target)
    return loaded


def _eagle_trained_for(folder: Path) -> TrainedFor:
    return read_eagle_config(folder)


KINDS: tuple[ModelKind, ...] = (
    ModelKind(
        name="draft",
        role="a draft model",
        help="Draft model for speculative strategies (local directory or fsspec URL).",
        marker="config.json",
        folder="a Hugging Face model",
        load=_load_draft,
    ),
    ModelKind(
        name="heads",
        role="heads trained on the target",
        help="Draft heads trained on the target (`accelgen train heads`) for medusa and blockwise: folder or URL.",
        marker="heads.json",
        folder="a folder `accelgen train heads` wrote",
        load=_load_heads,
        trained_for=_heads_trained_for,
    ),
    ModelKind(
        name="exits",
        role="exit heads trained on the target",
        help="Exit heads at intermediate layers of the target (`accelgen train exits`) for self_speculative and "
        "calm: folder or URL.",
        marker="exits.json",
        folder="a `train exits` folder",
        load=_load_exits,
        trained_for=_exits_trained_for,
    ),
    ModelKind(
        name="cmlm",
        role="a conditional masked LM (accelgen train cmlm)",
        help="Conditional masked LM distilled from the target (`accelgen train cmlm`) for mask_predict, and for "
        "speculative/specdec with drafter=cmlm: folder or URL.",
        marker="cmlm.json",
        folder="a `train cmlm` folder",
        load=_load_cmlm,
    ),
    ModelKind(
        name="eagle",
        role="an EAGLE head trained on the target (accelgen train eagle)",
        help="EAGLE draft head trained on the target's features (`accelgen train eagle`) for strategy eagle: "
        "folder or URL.",
        marker="eagle.json",
        folder="a `train eagle` folder",
        load=_load_eagle,
        trained_for=_eagle_trained_for,
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
