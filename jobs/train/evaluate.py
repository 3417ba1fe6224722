"""`train eval`: the numbers a model card reports, measured on the corpus' held-out split.

- held-out loss (nats/token) of the model, and of the draft when one is given;
- the loss of a unigram model (train-split token frequencies, add-one smoothed) on the same
  held-out tokens: the floor any language model must beat by a wide margin;
- draft-target greedy agreement: the share of held-out positions where both argmaxes match, the
  per-token acceptance rate α of greedy speculative decoding with this pair;
- decode tokens/s at batch 1 (plain `generate` with its KV cache), for the model and the draft.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from jobs.train.config import EvalJobConfig
from jobs.train.corpus import load_corpus
from jobs.train.tokenizer import encode_documents, load_tokenizer
from pipeline.errors import JobError


@dataclass
class EvalReport:
    model: str
    heldout_tokens: int  # positions scored
    loss_nats: float
    unigram_loss_nats: float
    decode_tokens_per_s: float | None
    draft: str | None = None
    draft_loss_nats: float | None = None
    greedy_agreement: float | None = None
    draft_decode_tokens_per_s: float | None = None


def evaluate(config: EvalJobConfig) -> EvalReport:
    """Measure `config.model` (and `config.draft`) on the held-out split; print and optionally save the report."""
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    device = torch.device(config.device)
    tokenizer = load_tokenizer(config.model)
    corpus = load_corpus(config.corpus)
    if not corpus.heldout:
        raise JobError(f"corpus {corpus.source} has no held-out documents; raise corpus.heldout_percent")
    heldout = encode_documents(tokenizer, corpus.heldout)  # [N]
    windows = heldout_windows(heldout, config.seq_len, config.max_tokens)  # [W, T+1]
    floor = unigram_loss(encode_documents(tokenizer, corpus.train), windows[:, 1:], len(tokenizer))
    prompt = heldout[: config.prompt_tokens].long().unsqueeze(0)  # [1, P]

    model = _load(config.model, device)
    loss, model_argmax = score(model, windows, config.batch_size)
    report = EvalReport(
        model=config.model,
        heldout_tokens=windows[:, 1:].numel(),
        loss_nats=round(loss, 4),
        unigram_loss_nats=round(floor, 4),
        decode_tokens_per_s=_maybe_speed(model, tokenizer, prompt, config.decode_tokens),
    )
    if config.draft:
        draft = _load(config.draft, device)
        if draft.config.vocab_size != model.config.vocab_size:
            raise JobError(f"draft {config.draft} and model {config.model} have different vocabularies")
        draft_loss, draft_argmax = score(draft, windows, config.batch_size)
        report.draft = config.draft
        report.draft_loss_nats = round(draft_loss, 4)
        report.greedy_agreement = round((draft_argmax == model_argmax).float().mean().item(), 4)
        report.draft_decode_tokens_per_s = _maybe_speed(draft, tokenizer, prompt, config.decode_tokens)
    for key, value in asdict(report).items():
        print(f"{key:>26}: {value}")
    if config.report:
        Path(config.report).parent.mkdir(parents=True, exist_ok=True)
        Path(config.report).write_text(json.dumps(asdict(report), indent=2) + "\n")
    return report


def heldout_windows(tokens: torch.Tensor, seq_len: int, max_tokens: int) -> torch.Tensor:
    """Consecutive windows of the held-out stream [N]: [W, T+1] int64, stride T, at most ~max_tokens scored."""
    seq_len = min(seq_len, len(tokens) - 1)
    if seq_len < 1:
        raise JobError("the held-out split holds fewer than 2 tokens; raise corpus.heldout_percent")
    count = min((len(tokens) - 1) // seq_len, max(1, math.ceil(max_tokens / seq_len)))
    return torch.stack([tokens[i * seq_len : i * seq_len + seq_len + 1] for i in range(count)]).long()


def unigram_loss(train_tokens: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of `targets` under add-one smoothed train-split token frequencies."""
    counts = torch.bincount(train_tokens.long(), minlength=vocab_size).double() + 1.0  # [V]
    log_p = counts.log() - counts.sum().log()  # [V]
    return -log_p[targets.flatten()].mean().item()


@torch.no_grad()
def score(model: torch.nn.Module, windows: torch.Tensor, batch_size: int) -> tuple[float, torch.Tensor]:
    """Mean next-token loss (nats) over `windows` [W, T+1], and the greedy prediction at each position [W, T]."""
    device = next(model.parameters()).device
    total, argmaxes = 0.0, []
    for chunk in windows.split(batch_size):
        chunk = chunk.to(device)  # [b, T+1]
        logits = model(input_ids=chunk[:, :-1]).logits.float()  # [b, T, V]
        total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
        argmaxes.append(logits.argmax(-1).cpu())
    return total / windows[:, 1:].numel(), torch.cat(argmaxes)


@torch.no_grad()
def decode_speed(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompt: torch.Tensor, n: int) -> float:
    """Greedy tokens/s at batch 1 for `n` new tokens after `prompt` [1, P], after one warm-up run."""
    prompt = prompt.to(next(model.parameters()).device)
    kwargs = {"do_sample": False, "pad_token_id": tokenizer.pad_token_id, "attention_mask": torch.ones_like(prompt)}
    model.generate(prompt, max_new_tokens=4, min_new_tokens=4, **kwargs)
    start = time.perf_counter()
    model.generate(prompt, max_new_tokens=n, min_new_tokens=n, **kwargs)
    return n / (time.perf_counter() - start)


def _maybe_speed(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompt: torch.Tensor, n: int
) -> float | None:
    return round(decode_speed(model, tokenizer, prompt, n), 1) if n > 0 else None


def _load(path: str, device: torch.device) -> torch.nn.Module:
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise JobError(f"{path} is not a loadable model directory ({exc})") from None
    return model.to(device).eval()
