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

    eagle.json                 shape, the target it was trained for (path, weights sha256), and the
                               draft vocabulary's size (`draft_vocab_size`, 0: none)
    eagle.safetensors          the projection and the decoder layer
    draft_vocab.safetensors    the draft vocabulary: `token_ids` [N], most frequent first, and their `counts`

The draft vocabulary (`strategies.artifacts.draft_vocab`) is the N tokens most frequent in the
training corpus. Drafting scores only those (`draft_logits`: an N-row slice of the LM head instead of
all V rows, and a softmax over N), which is most of a draft step's cost at a small head.

The layer runs the target forward's own arithmetic (`llama_forward.LayerMath`: Q/K/V and gate/up each
one matmul, queries and keys rotated together), its norms in the head's dtype as trained. A drafter
takes the fused weights once, again only after they change (`layer_weights`), and the rotary tables
once per proposal:
at batch 1 on a CPU a pass is mostly per-operation host work and reading its weights, so each
operation saved per depth counts.

A job refuses a head whose `target_weights_sha256` is not its target's
(`workers.common.model_files.check_trained_for_target`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from strategies.artifacts.configs import EAGLE_KIND, EagleConfig, read_eagle_config
from strategies.artifacts.draft_vocab import draft_rows, read_draft_vocab, to_target
from strategies.artifacts.weights_folder import load_weights, save_weights_folder
from strategies.runtime.kv_cache import SlotLayer
from strategies.runtime.linear import linear
from strategies.runtime.llama_forward import LayerMath, LayerWeights


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
        self.math: LayerMath | None = None  # the layer's arithmetic, with the target's rotary frequencies
        self.draft_ids: torch.Tensor | None = None  # [N] the draft vocabulary's target ids; None: all V
        self.draft_lm_head: torch.Tensor | None = None  # [N, H] the LM head's rows of the draft vocabulary

    def use_target(self, target: torch.nn.Module) -> None:
        """Attach the target's embedding, LM head and rotary frequencies (a Llama-family HF model)."""
        lm_head = target.get_output_embeddings().weight
        expected = (self.config.vocab_size, self.config.hidden_size)
        if tuple(lm_head.shape) != expected:
            raise ValueError(f"the target's LM head is {tuple(lm_head.shape)}, the EAGLE head expects {expected}")
        rotary = target.model.rotary_emb
        self.embed = target.get_input_embeddings().weight.detach()
        self.lm_head = lm_head.detach()
        c = self.config
        self.math = LayerMath(
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.rms_norm_eps,
            rotary.inv_freq.detach().float(),
            float(getattr(rotary, "attention_scaling", 1.0)),
            upcast_norm=False,  # trained with F.rms_norm in its own dtype: float64 stays float64
        )
        self._slice_draft_lm_head()

    def use_draft_vocab(self, token_ids: torch.Tensor | None) -> None:
        """Draft from these target ids only ([N], None: the whole vocabulary)."""
        self.draft_ids = None if token_ids is None else token_ids.to(device=self.fc.weight.device, dtype=torch.long)
        self._slice_draft_lm_head()

    def _slice_draft_lm_head(self) -> None:
        if self.lm_head is not None:
            self.draft_lm_head = draft_rows(self.lm_head, self.draft_ids)

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's LM head on (predicted) features, over the draft vocabulary: [..., H] -> [..., N];
        `to_target` turns an index among the N into the target's token id."""
        if self.draft_lm_head is None:
            raise ValueError("the EAGLE head reads the target's LM head: attach it with use_target()")
        return linear(features, self.draft_lm_head)

    def to_target(self, draft_tokens: torch.Tensor) -> torch.Tensor:
        """Target ids of indices into the draft vocabulary (any shape); the ids themselves without one."""
        return to_target(self.draft_ids, draft_tokens)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's LM head on (predicted) features: [..., H] -> [..., V]."""
        if self.lm_head is None:
            raise ValueError("the EAGLE head reads the target's LM head: attach it with use_target()")
        return linear(features, self.lm_head)

    def layer_weights(self) -> LayerWeights:
        """The decoder layer's weights with Q/K/V and gate/up each in one matrix: concatenated from the
        parameters (differentiable while training); a drafter fuses them once, again after they change."""
        return LayerWeights(
            norm_attn=self.attn_norm,
            w_qkv=torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]),
            b_qkv=None,
            w_o=self.o_proj.weight,
            norm_mlp=self.mlp_norm,
            w_gate_up=torch.cat([self.gate_proj.weight, self.up_proj.weight]),
            w_down=self.down_proj.weight,
        )

    def forward(
        self,
        features: torch.Tensor,  # [B, n, H] f_t, the target's or predicted
        tokens: torch.Tensor,  # [B, n] token t+1 of each
        # [B, n] t, or its rotary tables (`math.rope`: cos, sin [B, 1, n or 1, hd]) made once for several passes
        positions: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        allowed: torch.Tensor | None = None,  # [B, n, S+n] bool over the cache's slots, then the new ones
        cache: SlotLayer | None = None,  # the head's keys and values; None: a causal pass over the n alone
        weights: LayerWeights | None = None,  # `layer_weights()` taken once; None: taken for this pass
    ) -> torch.Tensor:
        """Predicted features f̂_{t+1}: [B, n, H]. Without a cache the n inputs form one causal chain per row."""
        if self.embed is None or self.math is None:
            raise ValueError("the EAGLE head reads the target's embedding: attach it with use_target()")
        math, w = self.math, weights or self.layer_weights()
        inputs = torch.cat([features, F.embedding(tokens, self.embed)], dim=-1)  # [B, n, 2H]
        x = linear(inputs, self.fc.weight, self.fc.bias)  # [B, n, H]
        cos, sin = math.rope(positions, x.dtype) if isinstance(positions, torch.Tensor) else positions
        q, k, v = math.project(x, w.norm_attn, w.w_qkv, w.b_qkv, cos, sin)
        if cache is None:
            gqa = math.num_kv_heads != math.num_heads
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            keys, values = cache.update(k, v)  # [B, Hkv, S+n, hd]
            attn = math.attend(q, keys, values, allowed[:, None])
        return math.mix(x, attn, w.w_o, w.norm_mlp, w.w_gate_up, w.w_down)

    def save(self, directory: Path) -> None:
        """Write `eagle.json` and `eagle.safetensors` (float32) to `directory` (the draft vocabulary is
        written apart, with its counts: `draft_vocab.save_draft_vocab`)."""
        save_weights_folder(directory, EAGLE_KIND, self.config, self)


def load_eagle(directory: Path, dtype: torch.dtype, device: torch.device, draft_vocab: bool = True) -> EagleHead:
    """The head saved in `directory`, in eval mode, with its draft vocabulary (`draft_vocab=False`: without
    reading it, for the command that writes it anew); it still needs `use_target`."""
    config = read_eagle_config(directory)
    head = EagleHead(config)
    head.load_state_dict(load_weights(directory, EAGLE_KIND))
    head = head.to(device=device, dtype=dtype).eval().requires_grad_(False)
    if draft_vocab:
        head.use_draft_vocab(read_draft_vocab(directory, EAGLE_KIND, config.draft_vocab_size, config.vocab_size))
    return head
