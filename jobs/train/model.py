"""Llama models of a given shape, and their export as a standard Hugging Face model directory.

Llama architecture (RMSNorm, RoPE, SwiGLU, grouped-query attention) so that every code path the
strategies take is the one real Llama/Qwen/Mistral checkpoints take. Input and output embeddings
are tied: with a vocabulary this large relative to the width, that halves the parameter count.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from jobs.train.config import LlamaShape
from pipeline.errors import JobError


def build_llama(shape: LlamaShape, tokenizer: PreTrainedTokenizerBase, seed: int) -> LlamaForCausalLM:
    """A freshly initialized float32 Llama of `shape` over `tokenizer`'s vocabulary, deterministic for `seed`."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def save_model_dir(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    out: Path,
    dtype: str,
    training: dict[str, Any],
) -> None:
    """Write `out` so that AutoModelForCausalLM/AutoTokenizer load it with no project code.

    config.json, model.safetensors (in `dtype`: the model is cast in place), generation_config.json,
    the tokenizer (its model_max_length set to the context), and training.json: what produced the weights.
    """
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # The module is cast, not a copy of its state: tied embeddings then stay one tensor, written once.
    model.to(getattr(torch, dtype)).save_pretrained(out)
    tokenizer.model_max_length = model.config.max_position_embeddings
    tokenizer.save_pretrained(out)
    (out / "training.json").write_text(json.dumps(training, indent=2) + "\n")


def load_float32(path: str, device: torch.device, frozen: bool) -> torch.nn.Module:
    """The model folder `path` in float32 on `device` (frozen: in eval mode with no gradients), or a
    JobError naming the `target` key when it does not load."""
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise JobError(f"target={path!r} is not a loadable model directory ({exc})") from None
    model = model.to(device)
    return model.eval().requires_grad_(False) if frozen else model
