"""A draft head's draft vocabulary (FR-Spec, Zhao et al. 2025; EAGLE-3): the N tokens most frequent in
its training corpus, the only ones it drafts.

Why: a head drafts through the target's LM head, V rows, and at a small batch on a CPU that pass is
most of a drafting step's cost; N rows cost N / V of it. The target still verifies with its whole
vocabulary, so the output is unchanged: a token outside the N is never drafted, only emitted by the
target. EAGLE's head and Medusa's heads (which blockwise decoding shares) keep one each, beside their
weights and announced by their config's `draft_vocab_size`:

    draft_vocab.safetensors    `token_ids` [N], most frequent first, and their `counts`
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

DRAFT_VOCAB_FILE = "draft_vocab.safetensors"


def save_draft_vocab(directory: Path, token_ids: torch.Tensor, counts: torch.Tensor) -> None:
    """Write `draft_vocab.safetensors`: the draft vocabulary's target ids [N] and their corpus counts [N]."""
    tensors = {"token_ids": token_ids.long().cpu().contiguous(), "counts": counts.long().cpu().contiguous()}
    save_file(tensors, str(directory / DRAFT_VOCAB_FILE))


def read_draft_vocab(directory: Path, kind: str, size: int, vocab_size: int) -> torch.Tensor | None:
    """The draft vocabulary's target ids [N] that `<kind>.json` announces (`size`; None for 0); a
    ValueError naming the file and the fix when it is missing or does not fit."""
    path, config_path = directory / DRAFT_VOCAB_FILE, directory / f"{kind}.json"
    if not size:
        if path.exists():
            raise ValueError(
                f"{path} exists but {config_path} says draft_vocab_size=0: delete the file, or set "
                "draft_vocab_size to its length"
            )
        return None
    redo = f"write it again with `accelgen train {kind} CONFIG draft_vocab_only=true`"
    if not path.exists():
        raise ValueError(f"{config_path} says draft_vocab_size={size} but {path} is missing: {redo}")
    try:
        token_ids = load_file(str(path)).get("token_ids")
    except SafetensorError as exc:
        raise ValueError(f"{path} is not a safetensors file ({exc}): {redo}") from None
    if token_ids is None or token_ids.dim() != 1 or len(token_ids) != size:
        found = "no token_ids" if token_ids is None else f"token_ids of shape {tuple(token_ids.shape)}"
        raise ValueError(f"{path} holds {found}, {config_path.name} says draft_vocab_size={size}: {redo}")
    if not (token_ids.min() >= 0 and token_ids.max() < vocab_size and len(token_ids.unique()) == len(token_ids)):
        raise ValueError(f"{path}: token_ids must be distinct ids below vocab_size={vocab_size}: {redo}")
    return token_ids


def draft_rows(lm_head: torch.Tensor, token_ids: torch.Tensor | None) -> torch.Tensor:
    """The rows of `lm_head` [V, H] a head drafts over: the draft vocabulary's [N, H], or all of it."""
    return lm_head if token_ids is None else lm_head[token_ids].contiguous()


def to_target(token_ids: torch.Tensor | None, drafted: torch.Tensor) -> torch.Tensor:
    """Target ids of indices into the draft vocabulary `token_ids` (any shape); the indices themselves
    where there is none (they are target ids already)."""
    return drafted if token_ids is None else token_ids[drafted]
