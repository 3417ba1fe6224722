"""The model runner: one Hugging Face causal LM behind the small interface every strategy uses.

Strategies never call the model directly. They pass new tokens with explicit positions and say
which earlier tokens each new token may attend to (a chain, or a tree); the runner turns that into
the 4D additive mask the model takes and keeps the ragged KV cache (`kv_cache.RaggedKV`) in step.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from strategies import llama_forward
from strategies.kv_cache import RaggedKV


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [B, n_kept, V]
    hidden: torch.Tensor | None  # [B, n, H] last hidden states (after the final norm), when asked for


class ModelRunner:
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
        b, n = input_ids.shape
        if b == 1 and n == 1 and bool(kv.valid.all()):  # one token over a dense cache: nothing to mask
            return self._run(kv, input_ids, positions, new_valid, None, logits_to_keep, want_hidden)
        if attend is None:
            attend = torch.ones(n, n, dtype=torch.bool, device=self.device).tril().expand(b, n, n)
        eye = torch.eye(n, dtype=torch.bool, device=self.device)
        attend = (attend & new_valid[:, None, :]) | eye  # [B, n, n]
        allowed = torch.cat([kv.valid[:, None, :].expand(b, n, kv.num_slots), attend], dim=2)  # [B, n, S+n]
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return self._run(kv, input_ids, positions, new_valid, mask[:, None], logits_to_keep, want_hidden)

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
        try:
            if self._fast is not None:
                logits, hidden = self._fast(input_ids, positions, mask, kv.layers, logits_to_keep)
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
            for layer, length in zip(kv.layers, lengths, strict=True):
                layer.length = length
            raise
        kv.append(new_valid)
        return ForwardOutput(logits=logits, hidden=hidden if want_hidden else None)

    def prefill(self, kv: RaggedKV, prompts: list[list[int]], want_hidden: bool = False) -> ForwardOutput:
        """Left-pad `prompts` into one forward: logits [B, 1, V] at each row's last prompt token, and
        (when asked) the hidden states [B, L, H] of every slot, row b's prompt in its last len(prompt)."""
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        valid = torch.zeros(len(prompts), width, dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            valid[row, width - len(prompt) :] = True
        ids, valid = ids.to(self.device), valid.to(self.device)
        positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)  # [B, L]
        return self.forward(kv, ids, positions, valid, logits_to_keep=1, want_hidden=want_hidden)
