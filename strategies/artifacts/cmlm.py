"""The conditional masked LM (CMLM): one Llama folder that fills a block of masked tokens in parallel.

Why a Llama and not an encoder: a CMLM conditions on a prompt and predicts a block of tokens that
see each other both ways. With a prefix-LM attention pattern, that is a plain causal Llama whose
attention over the block is bidirectional:

    [ context … | LENGTH | <len_N>  y_1 … y_N ]
      causal      sees the   see the context, LENGTH and every block token
                  context

The context part is exactly a causal LM's, so its keys and values are cached once per row (the
runner's `RaggedKV`) and each refinement pass runs only over the 2 + N tokens after it. The folder
loads with `AutoModelForCausalLM`; plain transformers runs it by passing the 4D mask (the tests do).

The length predictor is the same LM head: at the LENGTH marker, the next-token distribution over
the length tokens `<len_1>` … `<len_L>` is the distribution of the block's length (tokens up to
and including an EOS, at most L). `<len_N>` then tells the block how long it is. The tokenizer is
the target's with these tokens (and `<mask>`) added after its vocabulary, so every content id
means the same in both; the CMLM's logits are cut to the target's vocabulary for content.

    cmlm.json   format, the special ids, the longest block L, the target it was distilled from
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from strategies.artifacts.configs import read_weights_config, write_weights_config
from strategies.runtime.kv_cache import RaggedKV
from strategies.runtime.linear import linear
from strategies.runtime.runner import ModelRunner

KIND = "cmlm"
CONFIG_FILE = f"{KIND}.json"
MASK_TOKEN = "<mask>"
LENGTH_TOKEN = "<length>"


def length_token(n: int) -> str:
    return f"<len_{n}>"


@dataclass
class CMLMConfig:
    """What `cmlm.json` holds: the special token ids and the longest block the model was trained on."""

    content_vocab_size: int  # ids below it are the target's tokens; the special tokens follow
    mask_token_id: int
    length_token_id: int
    first_length_token_id: int  # <len_1>; <len_n> is first_length_token_id + n - 1
    max_length: int  # L: the longest block, and the number of length tokens
    target_path: str = ""  # the target distilled from (informative: any target with this vocabulary may use it)
    target_weights_sha256: str = ""
    training: dict[str, Any] = field(default_factory=dict)

    def length_id(self, n: int) -> int:
        return self.first_length_token_id + n - 1


def read_config(directory: Path) -> CMLMConfig:
    """The folder's `cmlm.json`; a ValueError naming the file and the fix otherwise."""
    return read_weights_config(directory, KIND, CMLMConfig)


def write_config(directory: Path, config: CMLMConfig) -> None:
    write_weights_config(directory, KIND, config)


@dataclass
class BlockRead:
    """What one CMLM forward read out."""

    lengths: torch.Tensor  # [B, L] float32 log p(length = n + 1) at the LENGTH marker
    # [B, W, H] the final states (what the LM head reads) at y_1 … y_W; None without a block. The head
    # runs only where a caller needs tokens (`token_logprobs`): most of a refinement pass's are kept.
    states: torch.Tensor | None


class CMLM:
    """A CMLM model runner and its config: feeds context into its cache and reads blocks over it."""

    def __init__(self, runner: ModelRunner, config: CMLMConfig) -> None:
        if runner.vocab_size < config.first_length_token_id + config.max_length:
            raise ValueError(
                f"the CMLM's vocabulary ({runner.vocab_size}) lacks the length tokens cmlm.json names "
                f"(up to id {config.first_length_token_id + config.max_length - 1})"
            )
        self.runner = runner
        self.config = config
        self.head = runner.model.get_output_embeddings().weight  # [V', H]

    @property
    def max_length(self) -> int:
        return self.config.max_length

    def new_kv(self, batch_size: int) -> RaggedKV:
        return self.runner.new_kv(batch_size)

    @torch.inference_mode()
    def read(self, kv: RaggedKV, feeds: list[list[int]], blocks: list[list[int]] | None = None) -> BlockRead:
        """Append each row's `feeds` tokens to its cached context (kept), then read LENGTH and, when
        `blocks` is given, each row's block `[<len_N>, y_1 … y_N]` (y: tokens or the mask id) over it;
        the LENGTH and block slots are dropped again, so `kv` holds the contexts only.

        One forward: `[feed (left-padded) | LENGTH | <len_N> y … (right-padded)]`.
        """
        runner, c = self.runner, self.config
        b = len(feeds)
        f = max(len(x) for x in feeds)
        sizes = [len(x) for x in blocks] if blocks is not None else [0] * b
        w = max(sizes)
        width = f + 1 + (w + 1 if blocks is not None else 0)
        ids = torch.full((b, width), c.mask_token_id, dtype=torch.long)
        valid = torch.zeros(b, width, dtype=torch.bool)
        for row, feed in enumerate(feeds):
            if feed:
                ids[row, f - len(feed) : f] = torch.tensor(feed, dtype=torch.long)
                valid[row, f - len(feed) : f] = True
            ids[row, f] = c.length_token_id
            valid[row, f] = True
            if blocks is not None:
                ids[row, f + 1] = c.length_id(sizes[row])
                ids[row, f + 2 : f + 2 + sizes[row]] = torch.tensor(blocks[row], dtype=torch.long)
                valid[row, f + 1 : f + 2 + sizes[row]] = True
        attend = torch.ones(width, width, dtype=torch.bool).tril()  # the feed and LENGTH: causal
        attend[f + 1 :, f + 1 :] = True  # the block sees itself both ways
        ids, valid = ids.to(runner.device), valid.to(runner.device)
        positions = kv.next_pos[:, None] + (valid.long().cumsum(dim=1) - 1).clamp(min=0)
        kept = kv.num_slots + f
        attend = attend.to(runner.device).expand(b, width, width)
        out = runner.forward(kv, ids, positions, valid, attend, logits_to_keep=1, want_hidden=True)
        kv.truncate(kept)
        first = c.first_length_token_id
        lengths = torch.log_softmax(linear(out.hidden[:, f], self.head[first : first + c.max_length]).float(), -1)
        return BlockRead(lengths, out.hidden[:, f + 2 :] if blocks is not None else None)

    @torch.inference_mode()
    def token_logprobs(self, states: torch.Tensor) -> torch.Tensor:
        """[..., H] final states -> [..., V] float32 log-probabilities over the content vocabulary."""
        return torch.log_softmax(linear(states, self.head[: self.config.content_vocab_size]).float(), dim=-1)

    @torch.inference_mode()
    def best_tokens(self, states: torch.Tensor, needed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each needed position's most likely token and its log-probability: (log p [B, W], token [B, W]),
        zero where not `needed` [B, W] (the head runs on the needed positions only)."""
        needed = needed.to(states.device)
        best, token = self.token_logprobs(states[needed]).max(dim=-1)  # [M] each
        logp = torch.zeros(needed.shape, dtype=best.dtype, device=states.device)
        tokens = torch.zeros(needed.shape, dtype=torch.long, device=states.device)
        logp[needed], tokens[needed] = best, token
        return logp.cpu(), tokens.cpu()
