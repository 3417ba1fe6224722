"""Small folders of weights that belong to one target (draft heads, exit heads, an EAGLE head):
`<kind>.json`, the module's config (`strategies.artifacts.configs`), beside `<kind>.safetensors` in
float32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from strategies.artifacts.configs import write_weights_config


def save_weights_folder(directory: Path, kind: str, config: Any, module: torch.nn.Module) -> None:
    """Write `<kind>.json` (the dataclass `config`) and `<kind>.safetensors` (`module`'s state, float32)."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().float().cpu().contiguous() for name, t in module.state_dict().items()}
    save_file(tensors, str(directory / f"{kind}.safetensors"))
    write_weights_config(directory, kind, config)


def load_weights(directory: Path, kind: str) -> dict[str, torch.Tensor]:
    return load_file(str(directory / f"{kind}.safetensors"))
