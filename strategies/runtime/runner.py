"""The model runner: one Hugging Face causal LM behind the small interface every strategy uses.

Strategies never call the model directly. They pass new tokens with explicit positions and say
which earlier tokens each new token may attend to (a chain, or a tree); the runner turns that into
the 4D additive mask the model takes and keeps the ragged KV cache (`kv_cache.RaggedKV`) in step.

On the lean Llama forward the runner also runs a range of layers at a time (early exit):
`layer_pass` takes one forward a range of layers at a time, optionally only some rows' states
through them while the others' states propagate (CALM); `forward_early` runs the first E layers
as provisional columns (a self-speculative draft step), which the next `forward` over the same
tokens reuses instead of computing those layers again. Other architectures refuse these
(`need_layers`).

Before decoding, the runner times whole forwards to choose the kernel of each of the lean forward's
matmul row counts and packs its weights for them (`warm_up`, from `kernel_timing.KernelTiming`).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch

from strategies.runtime import llama_forward
from strategies.runtime.kernel_timing import WARM_WIDTHS, KernelTiming

# Re-exported: callers that time forwards as the runner does take these with it.
from strategies.runtime.kernel_timing import synchronize as synchronize
from strategies.runtime.kernel_timing import synthetic_contexts as synthetic_contexts
from strategies.runtime.kv_cache import Provisional, RaggedKV
from strategies.runtime.prefix_cache import PrefixCache

# A prefill runs as forwards over chunks of its columns, some this many tokens each (rows × chunk width),
# never narrower than `PREFILL_MIN_CHUNK` columns: see `ModelRunner.prefill`.
PREFILL_CHUNK_TOKENS = 2048
PREFILL_MIN_CHUNK = 32


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [B, n_kept, V]
    hidden: torch.Tensor | None  # [B, n, H] last hidden states (after the final norm), when asked for
    # Slots of the [B, n] grid its token-wise matmuls ran over (`llama_forward.Slots`); None: all of them.
    computed: int | None = None


class ModelRunner(KernelTiming):
    """Runs a causal LM over a `RaggedKV`, with masks and positions chosen by the caller."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model.eval()
        config = model.config.get_text_config(decoder=True)
        first = next(model.parameters())
        self.device: torch.device = first.device
        self.dtype: torch.dtype = first.dtype
        self.vocab_size: int = model.get_output_embeddings().out_features
        self.max_context: int = int(config.max_position_embeddings)
        self.num_layers: int = int(config.num_hidden_layers)
        # transformers renamed `past_key_values` to `cache` during 5.x; take whichever this version has.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        # Llama-family models take the lean forward; any other causal LM runs through its own code.
        self._fast = llama_forward.LlamaForward(model) if llama_forward.supports(model) else None
        # Prompt prefixes computed before, which `cached_prefill.prefill` reuses; None: no cache.
        self.prefix_cache: PrefixCache | None = None

    def new_kv(self, batch_size: int) -> RaggedKV:
        return RaggedKV(self.num_layers, batch_size, self.device)

    @torch.inference_mode()
    def forward(
        self,
        kv: RaggedKV,
        input_ids: torch.Tensor,  # [B, n]
        positions: torch.Tensor,  # [B, n]
        new_valid: torch.Tensor,  # [B, n] bool: False for padding slots
        attend: torch.Tensor | None = None,  # [B, n, n] bool: new token i may see new token j
        logits_to_keep: int = 0,
        want_hidden: bool = False,
    ) -> ForwardOutput:
        """Append `n` slots to every row of `kv` and return logits for the new tokens.

        `attend=None` is a causal chain. Each new token also sees every valid slot of its row. A token
        always sees itself, so a padding row never meets an empty key set (which would give NaN).
        """
        if kv.provisional is not None:
            reused = self._reusable(kv, input_ids, positions, new_valid, attend)
            if reused:
                return self._forward_reusing(kv, reused, input_ids, positions, new_valid, logits_to_keep, want_hidden)
            kv.drop_provisional()
        b, n = input_ids.shape
        if b == 1 and n == 1 and bool(kv.valid.all()):  # one token over a dense cache: nothing to mask
            return self._run(kv, input_ids, positions, new_valid, None, logits_to_keep, want_hidden)
        mask = self._mask(kv.valid, new_valid, attend)
        return self._run(kv, input_ids, positions, new_valid, mask, logits_to_keep, want_hidden)

    def _mask(self, seen: torch.Tensor, new_valid: torch.Tensor, attend: torch.Tensor | None = None) -> torch.Tensor:
        """The additive mask [B, 1, n, S+n] of n new tokens over `seen` [B, S] (the earlier columns each
        may see) and each other (`attend` [B, n, n], None: a causal chain); a token always sees itself."""
        b, n = new_valid.shape
        causal, eye = square_masks(n, self.device)
        attend = ((causal if attend is None else attend) & new_valid[:, None, :]) | eye  # [B, n, n]
        allowed = torch.cat([seen[:, None, :].expand(b, n, seen.shape[1]), attend], dim=2)  # [B, n, S+n]
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return mask[:, None]

    def _mask_unless_dense(
        self, seen: torch.Tensor, new_valid: torch.Tensor, attend: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """`_mask`, or None for one token of one row over a dense cache (nothing to mask, as in `forward`)."""
        if new_valid.shape == (1, 1) and bool(seen.all()) and bool(new_valid.all()):
            return None
        return self._mask(seen, new_valid, attend)

    def _run(
        self,
        kv: RaggedKV,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        new_valid: torch.Tensor,
        mask: torch.Tensor | None,  # [B, 1, n, S+n] additive, or None: every slot visible
        logits_to_keep: int,
        want_hidden: bool,
    ) -> ForwardOutput:
        lengths = [layer.length for layer in kv.layers]
        slots = None
        try:
            if self._fast is not None:
                slots = llama_forward.Slots.of(new_valid, WARM_WIDTHS)
                logits, hidden = self._fast(input_ids, positions, mask, kv.layers, logits_to_keep, slots)
            else:
                out = self.model(
                    input_ids=input_ids,
                    attention_mask=mask,
                    position_ids=positions,
                    use_cache=True,
                    logits_to_keep=logits_to_keep,
                    output_hidden_states=want_hidden,
                    **{self._cache_arg: kv.cache},
                )
                logits, hidden = out.logits, (out.hidden_states[-1] if want_hidden else None)
        except BaseException:
            # Layers before the fault appended their slots: forget them, so every row's cache is
            # exactly as before the call.
            _restore(kv, lengths)
            raise
        kv.append(new_valid)
        computed = None if slots is None else int(slots.index.numel())
        return ForwardOutput(logits=logits, hidden=hidden if want_hidden else None, computed=computed)

    def compile(self) -> None:
        """`torch.compile` of the lean forward's layers (`model.compile`); a ValueError naming the model otherwise."""
        if self._fast is None:
            kind = getattr(self.model.config, "model_type", type(self.model).__name__)
            raise ValueError(
                f"model.compile=true compiles the lean Llama-family forward "
                f"({', '.join(llama_forward.SUPPORTED_MODEL_TYPES)}); this target is {kind!r}: set model.compile=false"
            )
        self._fast.compile()

    def need_layers(self) -> llama_forward.LlamaForward:
        """The lean forward, which alone runs a range of layers; a ValueError naming the model otherwise."""
        if self._fast is None:
            kind = getattr(self.model.config, "model_type", type(self.model).__name__)
            raise ValueError(
                f"early exit runs a range of the target's layers, which only the lean Llama-family forward "
                f"does ({', '.join(llama_forward.SUPPORTED_MODEL_TYPES)}); this target is {kind!r}"
            )
        return self._fast

    @torch.inference_mode()
    def layer_pass(
        self,
        kv: RaggedKV,
        input_ids: torch.Tensor,  # [B, n]
        positions: torch.Tensor,  # [B, n]
        new_valid: torch.Tensor,  # [B, n] bool
    ) -> LayerPass:
        """One forward of n new tokens (a chain per row) over `kv`, to be taken a range of layers at a
        time (`LayerPass`)."""
        kv.drop_provisional()
        mask = self._mask_unless_dense(kv.valid, new_valid)
        return LayerPass(self.need_layers(), kv, input_ids, positions, new_valid, mask)

    @torch.inference_mode()
    def forward_early(
        self,
        kv: RaggedKV,
        input_ids: torch.Tensor,  # [B, n]
        positions: torch.Tensor,  # [B, n]
        new_valid: torch.Tensor,  # [B, n] bool
        layers: int,
    ) -> torch.Tensor:
        """The first `layers` layers over n new tokens, written as provisional columns after any earlier
        ones (a self-speculative draft step): [B, n, D], the residual stream after layer `layers` - 1.

        The tokens form a chain after the earlier provisional columns; the next `forward` whose first
        tokens are these reuses their keys, values and states for those layers.
        """
        fast = self.need_layers()
        prov = kv.provisional
        if prov is not None and prov.layers != layers:
            kv.drop_provisional()
            prov = None
        seen = kv.valid if prov is None else torch.cat([kv.valid, prov.valid], dim=1)
        mask = self._mask_unless_dense(seen, new_valid)
        x = fast.embed(input_ids)
        lengths = [layer.length for layer in kv.layers]
        try:
            x = fast.run_layers(x, fast.rope(positions, x.dtype), mask, kv.layers, 0, layers)
        except BaseException:
            _restore(kv, lengths)
            raise
        kv.add_provisional(Provisional(layers, input_ids, positions, new_valid, x))
        return x

    @staticmethod
    def _reusable(
        kv: RaggedKV,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        new_valid: torch.Tensor,
        attend: torch.Tensor | None,
    ) -> int:
        """How many leading provisional columns this forward (a chain) may reuse: 0 unless, in each row,
        every token it feeds there is the provisional one (same token, same position) and both feed a
        prefix of their columns, so each reused column attended to exactly what it attends to now."""
        prov = kv.provisional
        count = min(prov.count, input_ids.shape[1])
        if attend is not None or count == 0:
            return 0
        fed, written = new_valid[:, :count], prov.valid[:, :count]
        if not (_is_prefix(fed) and _is_prefix(written)) or bool((fed & ~written).any()):
            return 0
        same = (input_ids[:, :count] == prov.ids[:, :count]) & (positions[:, :count] == prov.positions[:, :count])
        return 0 if bool((fed & ~same).any()) else count

    def _forward_reusing(
        self,
        kv: RaggedKV,
        reused: int,
        input_ids: torch.Tensor,  # [B, n]
        positions: torch.Tensor,  # [B, n]
        new_valid: torch.Tensor,  # [B, n] bool
        logits_to_keep: int,
        want_hidden: bool,
    ) -> ForwardOutput:
        """`forward` whose first `reused` tokens already went through the first E layers (provisional
        columns): those layers run only over the tokens after them, the others over every token."""
        fast = self.need_layers()
        kv.keep_provisional(reused)
        prov = kv.provisional
        lengths = [layer.length for layer in kv.layers]
        try:
            hidden = prov.hidden  # [B, reused, D] entering layer E
            if input_ids.shape[1] > reused:  # the tokens not drafted through: the first E layers now
                seen = torch.cat([kv.valid, new_valid[:, :reused]], dim=1)
                rest = fast.embed(input_ids[:, reused:])
                rope = fast.rope(positions[:, reused:], rest.dtype)
                rest = fast.run_layers(rest, rope, self._mask(seen, new_valid[:, reused:]), kv.layers, 0, prov.layers)
                hidden = torch.cat([hidden, rest], dim=1)
            rope = fast.rope(positions, hidden.dtype)
            x = fast.run_layers(hidden, rope, self._mask(kv.valid, new_valid), kv.layers, prov.layers, self.num_layers)
            logits, last = fast.head(x, logits_to_keep)
        except BaseException:
            _restore(kv, lengths)
            raise
        kv.provisional = None
        kv.append(new_valid)
        return ForwardOutput(logits=logits, hidden=last if want_hidden else None)

    def prefill(self, kv: RaggedKV, prompts: list[list[int]], want_hidden: bool = False) -> ForwardOutput:
        """Left-pad `prompts` and run them: logits [B, 1, V] at each row's last prompt token, and (when
        asked) the hidden states [B, L, H] of every slot, row b's prompt in its last len(prompt).

        The columns run in chunks of about `PREFILL_CHUNK_TOKENS` tokens, each a forward over the
        cache the earlier ones left (a causal chain, as one forward would be). Why: a whole prefill's
        activations and its masked attention scores ([B, heads, L, L]) run to hundreds of MB at a wide
        batch, which the allocator takes fresh from the kernel, each page faulting at its first touch,
        and hands back after; and masked attention computes every one of the L² scores. Chunked, each
        chunk's memory is the last one's again and attention covers the chunk's rows of the triangle.
        One row, or a few, is one chunk.

        Each row's positions go on from the tokens `kv` already holds for it (none in a new cache; a
        cached prefix, `cached_prefill`)."""
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        valid = torch.zeros(len(prompts), width, dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            valid[row, width - len(prompt) :] = True
        ids, valid = ids.to(self.device), valid.to(self.device)
        positions = kv.next_pos[:, None] + (valid.long().cumsum(dim=1) - 1).clamp(min=0)  # [B, L]
        chunk = max(PREFILL_MIN_CHUNK, PREFILL_CHUNK_TOKENS // len(prompts))
        hidden = []
        for start in range(0, width, chunk):
            cols = slice(start, min(width, start + chunk))
            out = self.forward(
                kv, ids[:, cols], positions[:, cols], valid[:, cols], logits_to_keep=1, want_hidden=want_hidden
            )
            hidden.append(out.hidden)
        return ForwardOutput(out.logits, torch.cat(hidden, dim=1) if want_hidden else None)


class LayerPass:
    """One forward of n new tokens over a `RaggedKV`, taken a range of layers at a time.

    Each layer runs once, in order (`run`); `x` is the residual stream between them and may be
    replaced (a state computed elsewhere, a propagated one). `finish` records the new slots once every
    layer has written them, so every layer and `kv.valid` keep one slot count; `abort` forgets them.
    """

    def __init__(
        self,
        fast: llama_forward.LlamaForward,
        kv: RaggedKV,
        input_ids: torch.Tensor,  # [B, n]
        positions: torch.Tensor,  # [B, n]
        new_valid: torch.Tensor,  # [B, n] bool
        mask: torch.Tensor | None,  # [B, 1, n, S+n]; None: every slot visible
    ) -> None:
        self.fast, self.kv, self.new_valid, self.mask = fast, kv, new_valid, mask
        self.x = fast.embed(input_ids)  # [B, n, D]
        self.rope = fast.rope(positions, self.x.dtype)
        self.done = 0  # layers run so far
        self._lengths = [layer.length for layer in kv.layers]

    @property
    def num_layers(self) -> int:
        return len(self.fast.layers)

    @torch.inference_mode()
    def run(self, end: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Layers [done, end) over `x`: [B, n, D] after them. Rows outside `rows` [R] (None: all) keep
        their state, whose keys and values each layer still writes (`LlamaForward.run_layers`)."""
        if not self.done <= end <= self.num_layers:
            raise ValueError(f"layers run in order: {self.done} done, asked up to {end} of {self.num_layers}")
        try:
            self.x = self.fast.run_layers(self.x, self.rope, self.mask, self.kv.layers, self.done, end, rows)
        except BaseException:
            self.abort()
            raise
        self.done = end
        return self.x

    @torch.inference_mode()
    def head(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The target's final norm and LM head on `x` of `rows` [R] (None: all): logits [R, n, V]."""
        return self.fast.head(self.x if rows is None else self.x[rows], 0)[0]

    @torch.inference_mode()
    def final_state(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The target's final norm on `x` of `rows` [R] (None: all), what its LM head reads: [R, n, D]."""
        return self.fast.final_state(self.x if rows is None else self.x[rows])

    def finish(self) -> None:
        """Record the new slots in `kv` once every layer has written them."""
        if self.done != self.num_layers:
            raise ValueError(f"a pass records its slots after all {self.num_layers} layers, not {self.done}")
        self.kv.append(self.new_valid)

    def abort(self) -> None:
        """Forget what the layers run so far wrote: every row's cache is as before the pass."""
        _restore(self.kv, self._lengths)


@functools.lru_cache(maxsize=64)
def square_masks(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, n] bool: a causal chain's mask and the identity, made once per width and device (to be read
    only): every masked forward and every EAGLE draft depth asks for them. Made outside inference mode,
    so that a cached pair serves any caller."""
    with torch.inference_mode(False):
        return torch.ones(n, n, dtype=torch.bool, device=device).tril(), torch.eye(n, dtype=torch.bool, device=device)


def _restore(kv: RaggedKV, lengths: list[int]) -> None:
    for layer, length in zip(kv.layers, lengths, strict=True):
        layer.length = length


def _is_prefix(valid: torch.Tensor) -> bool:
    """True when each row of `valid` [B, m] is True up to some column and False after it."""
    as_int = valid.long()
    return torch.equal(as_int.cummin(dim=1).values, as_int)
