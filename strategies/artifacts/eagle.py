"""EAGLE's draft head (Li et al. 2024): drafting in the target's feature space, one token at a time.

The target's feature f_t at position t (its last hidden state after the final norm: what its LM head
reads) and the embedding of the token t+1 that was chosen from it are concatenated, projected from
2d to d, and go through one Llama decoder layer (the shipped target's layer type) to a predicted
feature f̂_{t+1}. The target's frozen LM head turns f̂ into a distribution over token t+2, and f̂,
with the token drafted from it, is the next input: the head drafts autoregressively, each guess
conditioned on the tokens chosen before it, unlike Medusa's heads, which guess from one state.
The token in the input is what makes the next feature predictable: it removes the sampling's
uncertainty about which branch the feature continues.

Only the projection and the layer are the head's own. The target's embedding, LM head and rotary
frequencies are attached (`use_target`), never trained here or saved. The head lives in its own
folder (`strategies.artifacts.weights_folder`):

    eagle.json          shape, and the target it was trained for (path, weights sha256)
    eagle.safetensors   the projection and the decoder layer

A job refuses a head whose `target_weights_sha256` is not its target's (`workers.model_kinds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from strategies.artifacts.weights_folder import load_weights, read_weights_config, save_weights_folder
from strategies.runtime.kv_cache import SlotLayer

KIND = "eagle"


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
    target_path: str = ""  # where the target was when the head was trained (informative)
    target_weights_sha256: str = ""  # `model_loading.weights_sha256` of that target
    training: dict[str, Any] = field(default_factory=dict)  # what produced the head (informative)

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


class EagleHead(torch.nn.Module):
    """fc(cat(f, e(token))) through one decoder layer: [B, n, H] features and [B, n] tokens -> [B, n, H]."""

    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        self.config = config
        d, q_width = config.hidden_size, config.num_attention_heads * config.head_dim
        kv_width = config.num_key_value_heads * config.head_dim
        self.fc = torch.nn.Linear(2 * d, d)
        self.attn_norm = torch.nn.Parameter(torch.ones(d))
        self.q_proj = torch.nn.Linear(d, q_width, bias=False)
        self.k_proj = torch.nn.Linear(d, kv_width, bias=False)
        self.v_proj = torch.nn.Linear(d, kv_width, bias=False)
        self.o_proj = torch.nn.Linear(q_width, d, bias=False)
        self.mlp_norm = torch.nn.Parameter(torch.ones(d))
        self.gate_proj = torch.nn.Linear(d, config.intermediate_size, bias=False)
        self.up_proj = torch.nn.Linear(d, config.intermediate_size, bias=False)
        self.down_proj = torch.nn.Linear(config.intermediate_size, d, bias=False)
        # The target's, attached by `use_target`: buffers would register as the head's own and be saved.
        self.embed: torch.Tensor | None = None  # [V, H]
        self.lm_head: torch.Tensor | None = None  # [V, H]
        self.inv_freq: torch.Tensor | None = None  # [head_dim / 2]
        self.rope_scale = 1.0

    def use_target(self, target: torch.nn.Module) -> None:
        """Attach the target's embedding, LM head and rotary frequencies (a Llama-family HF model)."""
        lm_head = target.get_output_embeddings().weight
        expected = (self.config.vocab_size, self.config.hidden_size)
        if tuple(lm_head.shape) != expected:
            raise ValueError(f"the target's LM head is {tuple(lm_head.shape)}, the EAGLE head expects {expected}")
        rotary = target.model.rotary_emb
        self.embed = target.get_input_embeddings().weight.detach()
        self.lm_head = lm_head.detach()
        self.inv_freq = rotary.inv_freq.detach().float()
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's LM head on (predicted) features: [..., H] -> [..., V]."""
        if self.lm_head is None:
            raise ValueError("the EAGLE head reads the target's LM head: attach it with use_target()")
        return F.linear(features, self.lm_head)

    def forward(
        self,
        features: torch.Tensor,  # [B, n, H] f_t, the target's or predicted
        tokens: torch.Tensor,  # [B, n] token t+1 of each
        positions: torch.Tensor,  # [B, n] t
        allowed: torch.Tensor | None = None,  # [B, n, S+n] bool over the cache's slots, then the new ones
        cache: SlotLayer | None = None,  # the head's keys and values; None: a causal pass over the n alone
    ) -> torch.Tensor:
        """Predicted features f̂_{t+1}: [B, n, H]. Without a cache the n inputs form one causal chain per row."""
        if self.embed is None:
            raise ValueError("the EAGLE head reads the target's embedding: attach it with use_target()")
        c = self.config
        x = self.fc(torch.cat([features, F.embedding(tokens, self.embed)], dim=-1))  # [B, n, H]
        b, n, _ = x.shape
        h = F.rms_norm(x, (c.hidden_size,), self.attn_norm, c.rms_norm_eps)
        q = self.q_proj(h).view(b, n, c.num_attention_heads, c.head_dim).transpose(1, 2)  # [B, Hq, n, hd]
        k = self.k_proj(h).view(b, n, c.num_key_value_heads, c.head_dim).transpose(1, 2)  # [B, Hkv, n, hd]
        v = self.v_proj(h).view(b, n, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        freqs = positions[..., None].float() * self.inv_freq.to(positions.device)  # [B, n, hd/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = (emb.cos() * self.rope_scale).to(x.dtype), (emb.sin() * self.rope_scale).to(x.dtype)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        gqa = c.num_key_value_heads != c.num_attention_heads
        if cache is None:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            keys, values = cache.update(k, v)  # [B, Hkv, S+n, hd]
            mask = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
            mask.masked_fill_(~allowed, torch.finfo(x.dtype).min)
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None], enable_gqa=gqa)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, n, -1))
        h = F.rms_norm(x, (c.hidden_size,), self.mlp_norm, c.rms_norm_eps)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    def save(self, directory: Path) -> None:
        """Write `eagle.json` and `eagle.safetensors` (float32) to `directory`."""
        save_weights_folder(directory, KIND, self.config, self)


def read_config(directory: Path) -> EagleConfig:
    """The head's config; a ValueError naming the file when it is not an EAGLE folder of this format."""
    return read_weights_config(directory, KIND, EagleConfig)


def load_eagle(directory: Path, dtype: torch.dtype, device: torch.device) -> EagleHead:
    """The head saved in `directory`, in eval mode; it still needs `use_target`."""
    head = EagleHead(read_config(directory))
    head.load_state_dict(load_weights(directory, KIND))
    return head.to(device=device, dtype=dtype).eval().requires_grad_(False)
