"""What the folders of weights trained on one target (draft heads, exit heads, an EAGLE head) say of
themselves: `<kind>.json`, the module's config under a format name and version, which names the target
the weights were trained for (`target_weights_sha256`). A job checks these before any actor loads a
model, so reading them needs no torch (`weights_folder` and the modules' own files hold the weights).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

FORMAT_VERSION = 1
EAGLE_KIND = "eagle"  # an EAGLE head's folder: eagle.json, eagle.safetensors
C = TypeVar("C")


def write_weights_config(directory: Path, kind: str, config: Any) -> None:
    """Write `<kind>.json`: the dataclass `config` under its format name and version."""
    record = {"format": f"accelgen-{kind}", "format_version": FORMAT_VERSION, **asdict(config)}
    (directory / f"{kind}.json").write_text(json.dumps(record, indent=2) + "\n")


def read_weights_config(directory: Path, kind: str, config_type: type[C]) -> C:
    """The folder's config as `config_type`; a ValueError naming the file and the fix otherwise."""
    path = directory / f"{kind}.json"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{directory} holds no {path.name}: point model.{kind} at a `train {kind}` folder") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if record.pop("format", None) != f"accelgen-{kind}" or record.pop("format_version", None) != FORMAT_VERSION:
        raise ValueError(f"{path} is not an accelgen-{kind} file of version {FORMAT_VERSION}")
    try:
        return config_type(**record)
    except TypeError as exc:
        raise ValueError(f"{path}: {exc}") from None


@dataclass
class HeadsConfig:
    """What `heads.json` holds: enough to rebuild the module and to check it fits a target."""

    num_heads: int
    hidden_size: int
    vocab_size: int
    num_layers: int = 1
    shared_lm_head: bool = True  # False: each head has its own projection [V, H]
    draft_vocab_size: int = 0  # tokens of the draft vocabulary the heads draft over (`draft_vocab`); 0: all V
    target_path: str = ""  # where the target was when the heads were trained (informative)
    target_weights_sha256: str = ""  # `model_files.weights_sha256` of that target
    training: dict[str, Any] = field(default_factory=dict)  # what produced the heads (informative)


@dataclass
class ExitsConfig:
    """What `exits.json` holds: enough to rebuild the module and to check it fits a target."""

    layers: list[int]  # exit after this many layers, ascending, each in 1..num_layers-1
    num_layers: int  # the target's layers
    hidden_size: int
    vocab_size: int
    adapter_rank: int = 0  # 0: no adapter (norm + LM head only)
    classifier: bool = False  # CALM's trained confidence classifier, one per exit
    rms_norm_eps: float = 1e-6
    target_path: str = ""  # where the target was when the exits were trained (informative)
    target_weights_sha256: str = ""  # `model_files.weights_sha256` of that target
    training: dict[str, Any] = field(default_factory=dict)  # what produced the exits, held-out agreement

    def problem(self) -> str | None:
        """Why this config cannot describe exits of a target, or None."""
        if not self.layers or self.layers != sorted(set(self.layers)):
            return f"layers {self.layers} must be a non-empty ascending list without repeats"
        if self.layers[0] < 1 or self.layers[-1] >= self.num_layers:
            return f"layers {self.layers} must lie in 1..{self.num_layers - 1} (the last layer is the target's own)"
        if self.adapter_rank < 0:
            return f"adapter_rank={self.adapter_rank} must be >= 0"
        return None


@dataclass
class EagleConfig:
    """What `eagle.json` holds: enough to rebuild the head and to check it fits a target."""

    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    draft_vocab_size: int = 0  # tokens in draft_vocab.safetensors; 0: drafts score the whole vocabulary
    target_path: str = ""  # where the target was when the head was trained (informative)
    target_weights_sha256: str = ""  # `model_files.weights_sha256` of that target
    training: dict[str, Any] = field(default_factory=dict)  # what produced the head, held-out τ by tree

    def heldout_tau(self, tree: str) -> float | None:
        """τ of the `tree` drafts (chain, static, dynamic) that training measured on held-out text at the
        default sizes (`jobs/train/eagle.heldout_acceptance`); None where the card has none."""
        tau = self.training.get("heldout_acceptance", {}).get(tree, {}).get("tau")
        return float(tau) if isinstance(tau, (int, float)) else None

    @staticmethod
    def of_target(target: torch.nn.Module, **trained_for: str) -> EagleConfig:
        """The shape of a head for `target` (a Hugging Face Llama-family causal LM): its own layer's."""
        config = target.config
        heads = config.num_attention_heads
        return EagleConfig(
            hidden_size=config.hidden_size,
            vocab_size=target.get_output_embeddings().weight.shape[0],
            num_attention_heads=heads,
            num_key_value_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            intermediate_size=config.intermediate_size,
            rms_norm_eps=config.rms_norm_eps,
            **trained_for,
        )


def read_heads_config(directory: Path) -> HeadsConfig:
    """The heads' config; a ValueError naming the file when it is not a heads folder of this format."""
    return read_weights_config(directory, "heads", HeadsConfig)


def read_exits_config(directory: Path) -> ExitsConfig:
    """The exits' config; a ValueError naming the file when it is not an exits folder of this format."""
    return read_weights_config(directory, "exits", ExitsConfig)


def read_eagle_config(directory: Path) -> EagleConfig:
    """The head's config; a ValueError naming the file when it is not an EAGLE folder of this format."""
    return read_weights_config(directory, EAGLE_KIND, EagleConfig)
