"""Small folders of weights that belong to one target (draft heads, exit heads): `<kind>.json`, the
module's config with a format name and version, beside `<kind>.safetensors` in float32. The config
names the target the weights were trained for (`target_weights_sha256`), which a job checks."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors.torch import load_file, save_file

FORMAT_VERSION = 1
C = TypeVar("C")


def save_weights_folder(directory: Path, kind: str, config: Any, module: torch.nn.Module) -> None:
    """Write `<kind>.json` (the dataclass `config`) and `<kind>.safetensors` (`module`'s state, float32)."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().float().cpu().contiguous() for name, t in module.state_dict().items()}
    save_file(tensors, str(directory / f"{kind}.safetensors"))
    write_weights_config(directory, kind, config)


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


def load_weights(directory: Path, kind: str) -> dict[str, torch.Tensor]:
    return load_file(str(directory / f"{kind}.safetensors"))
