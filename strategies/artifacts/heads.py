"""Draft heads on the target's last hidden state: Medusa's heads, which blockwise decoding shares.

Head i (0-based) reads the target's last hidden state h_t at position t (after the final norm, the
state the LM head reads) and guesses token t+2+i: the token after the pending one is the target's
own (its LM head on h_t), so head 0 guesses the next after that. A head is `num_layers` ResBlocks
(h + SiLU(W h + b), W zero-initialised, so an untrained head starts as the LM head itself) with
weights of its own, then either the target's LM head (shared, frozen) or a projection of its own.

The heads live in a small folder of their own, beside no model code:

    heads.json                 format, shape, the target they were trained for (path, weights sha256),
                               and the draft vocabulary's size (`draft_vocab_size`, 0: none)
    heads.safetensors          the ResBlocks (and projections, when not shared)
    draft_vocab.safetensors    the draft vocabulary (`strategies.artifacts.draft_vocab`)

Shared heads draft over their draft vocabulary only (`draft_logits`): at batch 1 on a CPU, the pass of
three or four heads' states through all V rows of the LM head was most of a Medusa step's drafting.
Training and the heads' accuracy against every token use the whole LM head (`forward`).

A job refuses heads whose `target.weights_sha256` is not its target's
(`workers.common.model_files.check_trained_for_target`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from strategies.artifacts.configs import HeadsConfig, read_heads_config
from strategies.artifacts.draft_vocab import draft_rows, read_draft_vocab, to_target
from strategies.artifacts.weights_folder import load_weights, save_weights_folder
from strategies.runtime.linear import linear

CONFIG_FILE = "heads.json"
WEIGHTS_FILE = "heads.safetensors"


class ResBlock(torch.nn.Module):
    """h + SiLU(W h + b), with W and b zero at initialisation (the block starts as the identity).

    It holds one head's weights of one layer; `DraftHeads.features` runs every head's at once, and
    `forward`, one head at a time, is that batched pass's reference."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, hidden_size)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + F.silu(self.linear(h))


class DraftHeads(torch.nn.Module):
    """K heads; each its own ResBlocks (never one module reused across heads), then an LM head."""

    def __init__(self, config: HeadsConfig) -> None:
        super().__init__()
        self.config = config
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(*(ResBlock(config.hidden_size) for _ in range(config.num_layers)))
            for _ in range(config.num_heads)
        )
        # Own projections [V, H] per head (`start_projections` copies the target's LM head into them).
        self.projections = (
            None
            if config.shared_lm_head
            else torch.nn.ParameterList(
                torch.nn.Parameter(torch.zeros(config.vocab_size, config.hidden_size)) for _ in range(config.num_heads)
            )
        )
        # The target's LM head [V, H] when shared: not a parameter of the heads, never saved with them.
        self.lm_head: torch.Tensor | None = None
        self.draft_ids: torch.Tensor | None = None  # [N] the draft vocabulary's target ids; None: all V
        self.draft_lm_head: torch.Tensor | None = None  # [N, H] the shared LM head's rows of the draft vocabulary
        # Per layer, every head's ResBlock linear; their parameters; stacked by `_stacked_layers`.
        self._linears = [[block[layer].linear for block in self.blocks] for layer in range(config.num_layers)]
        self._block_params = [p for layer in self._linears for linear in layer for p in linear.parameters()]
        self._stacked: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._stacked_key: list[tuple[int, int]] | None = None

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    def features(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """The first `num_heads` heads' states (all: None) before the LM head: [..., H] -> [k, ..., H].

        Every head's ResBlock of one layer runs in one batched matmul (`ResBlock.forward` per head is
        the reference): at decode time k small matmuls and their module calls cost more than the
        arithmetic."""
        k = self.num_heads if num_heads is None else min(num_heads, self.num_heads)
        states = hidden.reshape(1, -1, hidden.shape[-1]).expand(k, -1, -1)  # [k, N, H]
        for weight_t, bias in self._stacked_layers(k):  # [k, H, H] each head's W transposed, [k, 1, H]
            states = states + F.silu(torch.baddbmm(bias, states, weight_t))
        return states.reshape(k, *hidden.shape)

    def _stacked_layers(self, k: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the first k heads' weights transposed and stacked [k, H, H] and biases [k, 1, H].

        Stacked again whenever a weight changed (trained, loaded, moved: its version or storage; an
        edit through `.data` changes neither and is not seen), and on every call while the weights are
        being trained, so that gradients reach each head's own."""
        params = self._block_params
        if torch.is_grad_enabled() and params[0].requires_grad:
            stacked = _stack(self._linears)
        else:
            key = [(p._version, p.data_ptr()) for p in params]
            if self._stacked_key != key:
                self._stacked, self._stacked_key = _stack(self._linears), key
            stacked = self._stacked
        return [(weight_t[:k], bias[:k]) for weight_t, bias in stacked]

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """Logits of the first `num_heads` heads (all: None): `hidden` [..., H] -> [k, ..., V]; head i
        guesses token t+2+i. A draft shallower than the heads skips the deeper ones: the LM head
        pass over each head's state is most of their cost."""
        states = self.features(hidden, num_heads)  # [k, ..., H]
        if self.projections is None:
            if self.lm_head is None:
                raise ValueError("shared-LM-head heads need the target's LM head: attach it with use_lm_head()")
            return linear(states, self.lm_head)  # one matmul for all heads
        return torch.stack([linear(s, w) for s, w in zip(states, self.projections, strict=True)])

    def draft_logits(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """`forward` over the draft vocabulary only: `hidden` [..., H] -> [k, ..., N] (N = V without one);
        `to_target` turns an index among the N into the target's token id."""
        if self.draft_ids is None:
            return self(hidden, num_heads)
        if self.draft_lm_head is None:
            raise ValueError("shared-LM-head heads need the target's LM head: attach it with use_lm_head()")
        return linear(self.features(hidden, num_heads), self.draft_lm_head)

    @property
    def drafted_tokens(self) -> int:
        """How many tokens the heads draft among: the draft vocabulary's, or the whole vocabulary's."""
        return self.config.vocab_size if self.draft_ids is None else len(self.draft_ids)

    def to_target(self, drafted: torch.Tensor) -> torch.Tensor:
        """Target ids of indices into the draft vocabulary (any shape); the ids themselves without one."""
        return to_target(self.draft_ids, drafted)

    def use_draft_vocab(self, token_ids: torch.Tensor | None) -> None:
        """Draft from these target ids only ([N], None: the whole vocabulary): heads that share the
        target's LM head only (own projections would each be sliced)."""
        if token_ids is not None and self.projections is not None:
            raise ValueError("a draft vocabulary needs heads that share the target's LM head (shared_lm_head=true)")
        self.draft_ids = None if token_ids is None else token_ids.to(device=self._block_params[0].device)
        self._slice_draft_lm_head()

    def _slice_draft_lm_head(self) -> None:
        if self.lm_head is not None:
            self.draft_lm_head = draft_rows(self.lm_head, self.draft_ids)

    def start_projections(self, lm_head: torch.Tensor) -> None:
        """Heads with their own projections start from the target's LM head [V, H] (as Medusa's do)."""
        if self.projections is not None:
            with torch.no_grad():
                for projection in self.projections:
                    projection.copy_(lm_head)

    def use_lm_head(self, lm_head: torch.Tensor) -> None:
        """Attach the target's LM head weight [V, H] (shared heads read it; it is never trained here)."""
        expected = (self.config.vocab_size, self.config.hidden_size)
        if tuple(lm_head.shape) != expected:
            raise ValueError(f"the target's LM head is {tuple(lm_head.shape)}, the heads expect {expected}")
        self.lm_head = lm_head.detach()  # a Parameter here would register as the heads' own and be saved
        self._slice_draft_lm_head()

    def save(self, directory: Path) -> None:
        """Write `heads.json` and `heads.safetensors` (float32) to `directory`."""
        save_weights_folder(directory, "heads", self.config, self)


def _stack(linears: list[list[torch.nn.Linear]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer: the heads' weights transposed [K, H, H] and biases [K, 1, H], each head's in its slice."""
    return [
        (
            torch.stack([m.weight for m in layer]).transpose(1, 2).contiguous(),
            torch.stack([m.bias for m in layer])[:, None],
        )
        for layer in linears
    ]


def load_heads(directory: Path, dtype: torch.dtype, device: torch.device, draft_vocab: bool = True) -> DraftHeads:
    """The heads saved in `directory`, in eval mode, with their draft vocabulary (`draft_vocab=False`:
    without reading it, for the command that writes it anew); shared heads still need `use_lm_head`."""
    config = read_heads_config(directory)
    heads = DraftHeads(config)
    heads.load_state_dict(load_weights(directory, "heads"))
    heads = heads.to(device=device, dtype=dtype).eval().requires_grad_(False)
    if draft_vocab:
        heads.use_draft_vocab(read_draft_vocab(directory, "heads", config.draft_vocab_size, config.vocab_size))
    return heads
