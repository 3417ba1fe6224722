"""The resumable training state on disk: written atomically, refused when the config changed.

One file, `state.pt`: model and optimizer state, steps completed, RNG states, wall time so far,
and the fingerprint of the config that produced it. It is written under a temporary name and
renamed, so a kill during a save leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from pipeline.errors import JobError

STATE_FILE = "state.pt"

# Keys that may change between an interrupted run and its resumption without changing the result
# (or, for storage options, that must never be written to disk).
_NOT_FINGERPRINTED = {
    "output_dir",
    "train.threads",
    "train.device",
    "train.checkpoint_every",
    "train.checkpoint_dir",
    "corpus.storage_options",
    "draft_vocab",  # a head's draft vocabulary (EAGLE's, the heads'): written beside it, never trained
    "draft_vocab_only",
}


def fingerprint(config: Any) -> dict[str, Any]:
    """The config's values that determine the trained weights, as {dotted key: value}."""
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if dotted in _NOT_FINGERPRINTED:
                continue
            if isinstance(value, dict):
                walk(value, dotted + ".")
            else:
                flat[dotted] = value

    walk(OmegaConf.to_container(OmegaConf.structured(config)), "")
    return flat


def save_checkpoint(directory: Path, state: dict[str, Any]) -> None:
    """Atomically replace `directory/state.pt` with `state`."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f"{STATE_FILE}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, directory / STATE_FILE)


def load_checkpoint(directory: Path, expected: dict[str, Any]) -> dict[str, Any] | None:
    """The state saved in `directory`, or None when there is none; a JobError if its config differs."""
    path = directory / STATE_FILE
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    saved = state["fingerprint"]
    changed = sorted(k for k in saved.keys() | expected.keys() if saved.get(k) != expected.get(k))
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {expected.get(k)!r}" for k in changed)
        raise JobError(
            f"checkpoint {path} was written by a run with a different config ({details}); "
            "restore those values to resume, or delete the checkpoint directory to start over"
        )
    return state
