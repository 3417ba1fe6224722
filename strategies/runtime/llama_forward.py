"""A lean forward pass for Llama-family models (Llama, Mistral without sliding window, Qwen2).

Why: on a CPU, and at small batch on any device, a decode step of a small model is dominated by
per-module overhead, not arithmetic. This forward reads the Hugging Face model's own weights and
computes the same function with fewer, larger operations: Q, K and V in one matmul, gate and up in
one matmul, rotary tables computed once per step for all layers, no per-call mask building.
Numerics follow transformers' Llama code (RMSNorm and rotary tables in float32, then cast back), so
greedy tokens equal those of the reference implementation; `tests/test_llama_forward.py` checks
logits against it in float64. One layer's arithmetic (`LayerMath`) is also what the EAGLE head's own
decoder layer runs (`strategies.artifacts.eagle`), with its norm in its own dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strategies.runtime.kv_cache import SlotLayer
from strategies.runtime.linear import linear

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
# A forward whose valid slots are at most this share of its grid runs its token-wise matmuls over them alone (`Slots`).
PACK_BELOW_FILL = 0.9
_STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass
class LayerWeights:
    """One decoder layer's weights, Q/K/V and gate/up each fused into one matrix."""

    norm_attn: torch.Tensor  # [D]
    w_qkv: torch.Tensor  # [(Hq + 2 Hkv) * hd, D]
    b_qkv: torch.Tensor | None
    w_o: torch.Tensor  # [D, Hq * hd]
    norm_mlp: torch.Tensor  # [D]
    w_gate_up: torch.Tensor  # [2 F, D]
    w_down: torch.Tensor  # [D, F]


def supports(model: torch.nn.Module) -> bool:
    """True when this forward computes exactly what `model` computes."""
    config = model.config
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES or config.hidden_act != "silu":
        return False
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and window < config.max_position_embeddings:
        return False
    rope_type = (getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}).get(
        "rope_type", "default"
    )
    inner = getattr(model, "model", None)
    return (
        rope_type in _STATIC_ROPE_TYPES
        and inner is not None
        and hasattr(inner, "rotary_emb")
        and not hasattr(inner.layers[0].self_attn, "q_norm")
        and getattr(inner.layers[0].mlp, "gate_proj", None) is not None
    )


def _fuse(params: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate parameters along dim 0 and make each a view of the result, so memory is not doubled."""
    fused = torch.cat([p.detach() for p in params])
    start = 0
    for p in params:
        p.data = fused[start : start + p.shape[0]]
        start += p.shape[0]
    return fused


class LayerMath:
    """The arithmetic of a Llama decoder layer given its weights (`LayerWeights`): the target's forward
    runs it for each of its layers, and a draft head made of the same layer type (EAGLE's) for its own.

    `upcast_norm`: RMSNorm of a dtype other than float32 runs in float32 and is cast back, as
    transformers' Llama does; False: in the input's own dtype (a head trained with `F.rms_norm`).
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        eps: float,
        inv_freq: torch.Tensor,  # [hd / 2] float32
        rope_scale: float,
        upcast_norm: bool = True,
    ) -> None:
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.eps, self.inv_freq, self.rope_scale, self.upcast_norm = eps, inv_freq, rope_scale, upcast_norm

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 or not self.upcast_norm:
            return F.rms_norm(x, (x.shape[-1],), weight, eps=self.eps)
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)  # in float32, as transformers does
        return weight * normed.to(x.dtype)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary tables of `positions` [B, n], shared by every layer of a forward: 2 x [B, 1, n, hd],
        the sine's first half negated (`rotate`)."""
        freqs = positions[:, None, :, None].float() * self.inv_freq.to(positions.device)  # [B, 1, n, hd/2]
        cos, sin = (freqs.cos() * self.rope_scale).to(dtype), (freqs.sin() * self.rope_scale).to(dtype)
        return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x·cos + rotate_half(x)·sin as transformers computes it, with rotate_half(x) = (−x₂, x₁) taken as
        the halves swapped (one `roll`) times the sine whose first half `rope` negated: the same products."""
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin

    def project(
        self,
        x: torch.Tensor,  # [B, n, D]
        norm: torch.Tensor,
        w_qkv: torch.Tensor,
        b_qkv: torch.Tensor | None,
        cos: torch.Tensor,  # [B, 1, n, hd]
        sin: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A layer's rotated queries [B, Hq, n, hd], keys and values [B, Hkv, n, hd] of `x`."""
        return self.heads(self.qkv(x, norm, w_qkv, b_qkv), cos, sin)

    def qkv(self, x: torch.Tensor, norm: torch.Tensor, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None) -> torch.Tensor:
        """The fused Q/K/V projection of the normed stream `x` [..., D]: [..., (Hq+2Hkv) hd]."""
        return linear(self.norm(x, norm), w_qkv, b_qkv)

    def heads(
        self,
        qkv: torch.Tensor,  # [B, n, (Hq+2Hkv) hd]
        cos: torch.Tensor,  # [B, 1, n, hd]
        sin: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`qkv` split into rotated queries [B, Hq, n, hd], keys and values [B, Hkv, n, hd]."""
        b, n, _ = qkv.shape
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        qk, v = qkv.split_with_sizes([q_width + kv_width, kv_width], dim=-1)  # not `split`: its Python wrapper costs
        # Queries and keys rotate together: one rotation for all Hq + Hkv heads.
        qk = self.rotate(qk.view(b, n, -1, self.head_dim).transpose(1, 2), cos, sin)  # [B, Hq+Hkv, n, hd]
        q, k = qk.split_with_sizes([self.num_heads, self.num_kv_heads], dim=1)
        return q, k, v.view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)

    def attend(
        self,
        q: torch.Tensor,  # [B, Hq, n, hd]
        keys: torch.Tensor,  # [B, Hkv, S, hd]
        values: torch.Tensor,
        mask: torch.Tensor | None,  # [B, 1, n, S] additive, or bool (True: may attend); None: all visible
    ) -> torch.Tensor:
        """Attention of the queries over the slots: [B, Hq, n, hd]."""
        gqa = self.num_kv_heads != self.num_heads
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)

    def mix(
        self,
        x: torch.Tensor,  # [R, n, D] the residual stream of the rows going on
        attn: torch.Tensor,  # [R, Hq, n, hd] their attention output
        w_o: torch.Tensor,
        norm_mlp: torch.Tensor,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
    ) -> torch.Tensor:
        """The rest of a layer after attention: output projection and MLP, each added to the stream."""
        r, n, _ = x.shape
        return self.mix_flat(x, attn.transpose(1, 2).reshape(r, n, -1), w_o, norm_mlp, w_gate_up, w_down)

    def mix_flat(
        self,
        x: torch.Tensor,  # [..., D]
        attn: torch.Tensor,  # [..., Hq hd] the attention output, heads side by side
        w_o: torch.Tensor,
        norm_mlp: torch.Tensor,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
    ) -> torch.Tensor:
        """`mix` over tokens in any layout: each token's output projection and MLP are its own."""
        x = x + linear(attn, w_o)
        gate, up = linear(self.norm(x, norm_mlp), w_gate_up).chunk(2, dim=-1)
        return x + linear(F.silu(gate) * up, w_down)


class LlamaForward(LayerMath):
    """The forward of a supported model over `SlotLayer` caches; weights are shared, not copied twice."""

    def __init__(self, model: torch.nn.Module) -> None:
        inner = model.model
        config = model.config
        num_heads = config.num_attention_heads
        super().__init__(
            num_heads=num_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
            eps=config.rms_norm_eps,
            inv_freq=inner.rotary_emb.inv_freq.float(),  # [hd / 2]
            rope_scale=float(getattr(inner.rotary_emb, "attention_scaling", 1.0)),
        )
        self.embed_weight = inner.embed_tokens.weight  # [V, D]
        self.final_norm = inner.norm.weight
        self.lm_head = model.lm_head.weight  # [V, D]
        self.layers = []
        with torch.no_grad():
            for layer in inner.layers:
                attn, mlp = layer.self_attn, layer.mlp
                qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
                w_qkv = _fuse([m.weight for m in qkv])
                b_qkv = _fuse([m.bias for m in qkv]) if all(m.bias is not None for m in qkv) else None
                self.layers.append(
                    LayerWeights(
                        norm_attn=layer.input_layernorm.weight,
                        w_qkv=w_qkv,
                        b_qkv=b_qkv,
                        w_o=attn.o_proj.weight,
                        norm_mlp=layer.post_attention_layernorm.weight,
                        w_gate_up=_fuse([mlp.gate_proj.weight, mlp.up_proj.weight]),
                        w_down=mlp.down_proj.weight,
                    )
                )

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The residual stream entering layer 0: `input_ids` [B, n] -> [B, n, D]."""
        return F.embedding(input_ids, self.embed_weight)

    def run_layers(
        self,
        x: torch.Tensor,  # [B, n, D] the residual stream entering layer `start`
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,  # [B, 1, n, S + n] additive over each layer's slots; None: all visible
        caches: list[SlotLayer],  # every layer's cache, indexed by layer
        start: int,
        end: int,
        rows: torch.Tensor | None = None,  # [R] rows whose state goes through the layers; None: all
    ) -> torch.Tensor:
        """Layers [start, end) over n new tokens, each appending their keys and values to its cache.

        Rows outside `rows` keep their state unchanged through these layers (CALM's state
        propagation): each layer still writes their keys and values, projected from that state, so
        later tokens have something to attend to; their output projection and MLP are skipped (attention
        runs for every row while any goes on: gathering rows of the cache would cost more).
        """
        for index in range(start, end):
            x = self._layer(self.layers[index], x, rope, mask, caches[index], rows)
        return x

    def _layer(
        self,
        layer: LayerWeights,
        x: torch.Tensor,  # [B, n, D]
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
        cache: SlotLayer,
        rows: torch.Tensor | None,
    ) -> torch.Tensor:
        q, k, v = self.project(x, layer.norm_attn, layer.w_qkv, layer.b_qkv, *rope)
        keys, values = cache.update(k, v)  # [B, Hkv, S+n, hd]
        if rows is not None and rows.numel() == 0:
            return x
        # Attention runs for every row: gathering the going rows' cache would copy more than their
        # queries cost. The MLP, the larger part, runs for the going rows only.
        attn = self.attend(q, keys, values, mask)  # [B, Hq, n, hd]
        inner = x
        if rows is not None:  # only these rows go on through the layer
            attn, inner = attn[rows], x[rows]
        inner = self.mix(inner, attn, layer.w_o, layer.norm_mlp, layer.w_gate_up, layer.w_down)
        return inner if rows is None else x.index_copy(0, rows, inner)

    def compile(self) -> None:
        """`torch.compile` each layer's parts around the cache and attention (`model.compile`).

        The cache append and attention stay eager: the ragged cache appends in place at a length that
        grows every step into storage that is reallocated as it grows. The parts compiled here see
        shapes that depend on the batch and the new tokens only, compiled with dynamic sizes (sizes of
        1 are specialized: a few compiles per actor). Compiling the whole forward, cache included, also
        gives the same tokens but compiled longer and saved less (`jobs/bench/compile.py`, docs/performance.md).
        """
        self.qkv = torch.compile(self.qkv, dynamic=True)
        self.heads = torch.compile(self.heads, dynamic=True)
        self.mix_flat = torch.compile(self.mix_flat, dynamic=True)

    def final_state(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm of the last layer's output `x` [..., D]: what the LM head reads."""
        return self.norm(x, self.final_norm)

    def head(self, x: torch.Tensor, logits_to_keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The final norm and LM head on the last layer's output `x` [B, n, D]: (logits [B, n_kept, V],
        last hidden states [B, n, D])."""
        hidden = self.final_state(x)
        kept = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
        return linear(kept, self.lm_head), hidden

    def __call__(
        self,
        input_ids: torch.Tensor,  # [B, n]
        positions: torch.Tensor,  # [B, n]
        mask: torch.Tensor | None,  # [B, 1, n, S + n] additive; None: every slot visible
        caches: list[SlotLayer],
        logits_to_keep: int,
        slots: Slots | None = None,  # the slots whose token-wise matmuls run; None: every slot
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, n_kept, V], last hidden states [B, n, D]).

        With `slots`, every token-wise matmul runs over those slots only and attention over the whole
        grid; another slot's keys, values, hidden state and logits are zeros (it must be padding, whose
        keys and values the cache marks invalid, never attended to)."""
        x = self.embed(input_ids)  # [B, n, D]
        rope = self.rope(positions, x.dtype)
        if slots is None:
            x = self.run_layers(x, rope, mask, caches, 0, len(self.layers))
            return self.head(x, logits_to_keep)
        packed = slots.take(x)  # [N, D]
        for layer, cache in zip(self.layers, caches, strict=True):
            packed = self._packed_layer(layer, packed, rope, mask, cache, slots)
        normed = self.final_state(packed)  # [N, D]
        hidden = slots.spread(normed)  # [B, n, D]
        if logits_to_keep:
            return linear(hidden[:, -logits_to_keep:], self.lm_head), hidden
        return slots.spread(linear(normed, self.lm_head)), hidden

    def _packed_layer(
        self,
        layer: LayerWeights,
        packed: torch.Tensor,  # [N, D] the stream of the computed slots
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
        cache: SlotLayer,
        slots: Slots,
    ) -> torch.Tensor:
        """`_layer` with its matmuls over `slots` alone; attention and the cache see the whole grid."""
        q, k, v = self.heads(slots.spread(self.qkv(packed, layer.norm_attn, layer.w_qkv, layer.b_qkv)), *rope)
        keys, values = cache.update(k, v)
        attn = self.attend(q, keys, values, mask).transpose(1, 2).reshape(*slots.grid, -1)  # [B, n, Hq hd]
        return self.mix_flat(packed, slots.take(attn), layer.w_o, layer.norm_mlp, layer.w_gate_up, layer.w_down)


@dataclass
class Slots:
    """The slots of a forward's [B, n] grid whose token-wise matmuls run, the others being padding.

    Why: a batch's verify forward is as wide as its longest draft, so rows that drafted less, and rows
    already finished, fill it with padding, as do a prefill's shorter prompts, often a large share
    of the grid. On a CPU the matmuls cost about what their tokens do; gathering
    the computed ones costs a copy of the stream per layer. On other devices a small forward is bound
    by launches, not arithmetic, and counting the slots would wait for the device: there it runs padded.

    oneDNN builds a kernel for each row count it first meets (at a cost of the order of a step), and
    decoding warms up only the row counts of padded steps (`ModelRunner.warm_up`).
    So a count above `exact_up_to` (those one row's steps warm) is rounded up to a multiple of B, the
    row count of a padded forward that much narrower, with padding slots computed to fill it.
    """

    index: torch.Tensor  # [N] flat indices of the computed slots in the [B * n] grid
    grid: tuple[int, int]  # (B, n)

    @staticmethod
    def of(valid: torch.Tensor, exact_up_to: int) -> Slots | None:
        """The slots to compute of a grid whose valid slots are `valid` [B, n], or None where the whole
        grid runs: one at least `PACK_BELOW_FILL` computed, or one off the CPU."""
        if valid.device.type != "cpu":
            return None
        rows, width = valid.shape
        flat = valid.reshape(-1)
        filled = int(flat.sum())
        count = -(-filled // rows) * rows if filled > exact_up_to else filled
        if count > PACK_BELOW_FILL * flat.numel():
            return None
        computed = flat.clone()
        computed[(~flat).nonzero().squeeze(1)[: count - filled]] = True  # padding slots to fill the count
        return Slots(computed.nonzero().squeeze(1), (rows, width))

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """[B, n, ...] -> [N, ...]: the computed slots' rows."""
        return x.reshape(-1, *x.shape[2:]).index_select(0, self.index)

    def spread(self, x: torch.Tensor) -> torch.Tensor:
        """[N, ...] -> [B, n, ...], zeros at the slots not computed."""
        full = x.new_zeros(self.grid[0] * self.grid[1], *x.shape[1:])
        return full.index_copy_(0, self.index, x).view(*self.grid, *x.shape[1:])
