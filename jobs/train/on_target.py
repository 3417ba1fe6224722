"""What every training job on the shipped target starts with (heads, exits, CLLM, CMLM): its threads
and device, the target and its tokenizer, where its checkpoints go, and what they must match."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from jobs.train import checkpoint
from jobs.train.loop import use_device
from jobs.train.model import load_float32
from jobs.train.tokenizer import load_tokenizer
from workers.common.model_files import weights_sha256


@dataclass
class TargetRun:
    device: torch.device
    target: torch.nn.Module  # float32, on `device`
    tokenizer: PreTrainedTokenizerBase
    output_dir: Path
    checkpoint_dir: Path
    # The config's fingerprint with the target's weights hash: a checkpoint made on another target
    # (or the same folder retrained) is not resumed.
    fingerprint: dict[str, Any]


def start_on_target(config: Any, frozen: bool) -> TargetRun:
    """Set `config.train`'s threads, then load `config.target` (frozen, or as a copy to fine-tune)."""
    device = use_device(config.train.device, config.train.threads)
    out = Path(config.output_dir)
    return TargetRun(
        device=device,
        target=load_float32(config.target, device, frozen=frozen),
        tokenizer=load_tokenizer(config.target),
        output_dir=out,
        checkpoint_dir=Path(config.train.checkpoint_dir or out / "checkpoint"),
        fingerprint={**checkpoint.fingerprint(config), "target_weights_sha256": weights_sha256(Path(config.target))},
    )
