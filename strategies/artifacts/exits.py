"""Exit heads: next-token guesses from the target's intermediate layers (early exit: CALM, self-speculation).

Exit l reads the residual stream after the target's first l layers, h_l, and guesses the next token
as the target's final layer would: a norm of its own (started from the target's final norm), an
optional low-rank adapter (z + U(D z), U zero-initialised, so an untrained exit is the "logit lens":
the final norm and LM head applied to h_l), then the target's own LM head, shared and frozen. An
exit may also carry CALM's confidence classifier: a logistic unit on z that estimates whether this
layer's argmax equals the final layer's.

The exits live in a small folder of their own:

    exits.json          format, shape, and the target they were trained for (path, weights sha256)
    exits.safetensors   norms, adapters and classifiers (the LM head is the target's, never saved)

A job refuses exits whose `target.weights_sha256` is not its target's
(`workers.common.model_files.check_trained_for_target`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from strategies.artifacts.configs import ExitsConfig, read_exits_config
from strategies.artifacts.weights_folder import load_weights, save_weights_folder
from strategies.runtime.linear import linear

CONFIG_FILE = "exits.json"
WEIGHTS_FILE = "exits.safetensors"


class Exit(torch.nn.Module):
    """One exit: norm, optional adapter, optional classifier; the LM head is passed in."""

    def __init__(self, config: ExitsConfig) -> None:
        super().__init__()
        self.eps = config.rms_norm_eps
        self.norm = torch.nn.Parameter(torch.ones(config.hidden_size))
        self.down = self.up = None
        if config.adapter_rank:
            self.down = torch.nn.Linear(config.hidden_size, config.adapter_rank, bias=False)
            self.up = torch.nn.Linear(config.adapter_rank, config.hidden_size, bias=False)
            torch.nn.init.zeros_(self.up.weight)
        self.classifier = torch.nn.Linear(config.hidden_size, 1) if config.classifier else None

    def state(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the LM head reads: `hidden` [..., H] (the residual stream after the exit's layer) -> [..., H]."""
        wide = hidden.float() if hidden.element_size() < 4 else hidden  # half precision: normalise in float32
        normed = F.rms_norm(wide, (hidden.shape[-1],), eps=self.eps).to(hidden.dtype) * self.norm
        if self.up is None:
            return normed
        return normed + self.up(self.down(normed))

    def confidence(self, state: torch.Tensor) -> torch.Tensor:
        """The classifier's probability that this exit's argmax is the final layer's: [..., H] -> [...].
        Trained class-balanced (`accelgen train exits`), it estimates that probability as if agreeing and
        disagreeing positions were equally common: not a calibrated probability, so CALM's threshold on
        it is chosen by `accelgen calibrate calm`."""
        return torch.sigmoid(self.classifier(state)).squeeze(-1)


class ExitHeads(torch.nn.Module):
    """Exits at `config.layers` of one target, reading its LM head (attached with `use_lm_head`)."""

    def __init__(self, config: ExitsConfig) -> None:
        super().__init__()
        problem = config.problem()
        if problem is not None:
            raise ValueError(f"exits: {problem}")
        self.config = config
        self.exits = torch.nn.ModuleDict({str(layer): Exit(config) for layer in config.layers})
        self.lm_head: torch.Tensor | None = None  # [V, H] the target's, never a parameter of the exits

    @property
    def layers(self) -> list[int]:
        return list(self.config.layers)

    @property
    def has_classifier(self) -> bool:
        return self.config.classifier

    def start_norms(self, final_norm: torch.Tensor) -> None:
        """Every exit's norm starts as the target's final norm [H]: untrained, an exit is the logit lens."""
        with torch.no_grad():
            for module in self.exits.values():
                module.norm.copy_(final_norm)

    def use_lm_head(self, lm_head: torch.Tensor) -> None:
        """Attach the target's LM head weight [V, H] (read by every exit, never trained or saved here)."""
        expected = (self.config.vocab_size, self.config.hidden_size)
        if tuple(lm_head.shape) != expected:
            raise ValueError(f"the target's LM head is {tuple(lm_head.shape)}, the exits expect {expected}")
        self.lm_head = lm_head.detach()

    def exit(self, layer: int) -> Exit:
        if str(layer) not in self.exits:
            raise ValueError(f"no exit after layer {layer}; the exits are after layers {self.layers}")
        return self.exits[str(layer)]

    def logits(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """The exit's next-token logits: `hidden` [..., H] after `layer` layers -> [..., V]."""
        if self.lm_head is None:
            raise ValueError("exits read the target's LM head: attach it with use_lm_head()")
        return linear(self.exit(layer).state(hidden), self.lm_head)

    def save(self, directory: Path) -> None:
        """Write `exits.json` and `exits.safetensors` (float32) to `directory`."""
        save_weights_folder(directory, "exits", self.config, self)


def load_exits(directory: Path, dtype: torch.dtype, device: torch.device) -> ExitHeads:
    """The exits saved in `directory`, in eval mode; they still need the target's `use_lm_head`."""
    exits = ExitHeads(read_exits_config(directory))
    exits.load_state_dict(load_weights(directory, "exits"))
    return exits.to(device=device, dtype=dtype).eval().requires_grad_(False)


def untrained_exits(
    model: torch.nn.Module, layers: list[int], adapter_rank: int = 0, classifier: bool = False
) -> ExitHeads:
    """Exits for a Hugging Face Llama-family `model` as they start training: the logit lens at `layers`."""
    config = model.config
    exits = ExitHeads(
        ExitsConfig(
            layers=sorted(layers),
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            vocab_size=model.get_output_embeddings().out_features,
            adapter_rank=adapter_rank,
            classifier=classifier,
            rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
        )
    )
    exits.start_norms(model.model.norm.weight)
    exits.use_lm_head(model.get_output_embeddings().weight)
    return exits.to(device=model.lm_head.weight.device, dtype=model.lm_head.weight.dtype)
