"""A Llama whose next-token logits are a literal table: a scripted target for hand-computed tests."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def bigram_model(logits: torch.Tensor) -> LlamaForCausalLM:
    """A float64 Llama whose logits after token t are `logits[t]` ([V, V]), whatever comes before t.

    The embeddings are one-hot (hidden size V), every layer's output projections are zero (the
    residual stream stays the token's embedding), the final RMS norm (no epsilon) scales a one-hot
    by √V, and the LM head undoes that scale. Distributions at every position are literal, yet the
    model runs through every code path a real target takes (masks, positions, KV cache).
    """
    vocab = logits.shape[0]
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=vocab,
        intermediate_size=vocab,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        rms_norm_eps=0.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(config).to(torch.float64)
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(torch.eye(vocab, dtype=torch.float64))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.copy_(logits.to(torch.float64).T / vocab**0.5)
    return model.eval()


def argmax_table(successor: list[int]) -> torch.Tensor:
    """Logits [V, V] whose greedy choice after token t is `successor[t]` (1 there, 0 elsewhere)."""
    return torch.nn.functional.one_hot(torch.tensor(successor), len(successor)).to(torch.float64)
