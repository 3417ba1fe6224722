"""Counting a draft head's draft vocabulary (`strategies.artifacts.draft_vocab`) for `train eagle` and
`train heads`: the N tokens most frequent in the corpus' training split, counted after training and
written beside the head with their counts. `draft_vocab_only=true` does only that, for a head already
trained (a shipped one): its weights are read for its held-out measurement alone, never written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from transformers import PreTrainedTokenizerBase

from jobs.train.corpus import Corpus
from jobs.train.tokenizer import encode_documents
from pipeline.errors import JobError
from strategies.artifacts.configs import write_weights_config
from strategies.artifacts.draft_vocab import DRAFT_VOCAB_FILE, save_draft_vocab
from workers.common.model_files import weights_sha256


class DraftingHead(Protocol):
    """What counting a draft vocabulary needs of a head: its config (`vocab_size`, `draft_vocab_size`,
    `target_weights_sha256`, `target_path`, `training`) and `use_draft_vocab`."""

    config: Any

    def use_draft_vocab(self, token_ids: torch.Tensor | None) -> None: ...


Head = TypeVar("Head", bound=DraftingHead)


@dataclass
class DraftVocab:
    """A head's draft vocabulary as counted, and what its config records of it."""

    token_ids: torch.Tensor  # [N] most frequent first
    counts: torch.Tensor  # [N]
    record: dict[str, Any]  # size, tokens counted, coverage, corpus

    def save(self, directory: Path) -> None:
        """Write `draft_vocab.safetensors`, or remove a stale one when the head drafts over every token."""
        if len(self.token_ids):
            save_draft_vocab(directory, self.token_ids, self.counts)
        else:
            (directory / DRAFT_VOCAB_FILE).unlink(missing_ok=True)


def most_frequent(tokens: torch.Tensor, vocab_size: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `size` most frequent ids among `tokens` [M] (ties: the lower id first) and their counts: [size] each."""
    counts = torch.bincount(tokens.long(), minlength=vocab_size)  # [V]
    order = torch.argsort(counts, descending=True, stable=True)[:size]
    return order, counts[order]


def use_draft_vocab(
    job: str, head: DraftingHead, size: int, tokenizer: PreTrainedTokenizerBase, corpus: Corpus
) -> DraftVocab:
    """Count the corpus' training split and make its `size` most frequent tokens `head`'s draft vocabulary
    (0: the whole vocabulary); printed."""
    if not size:
        head.use_draft_vocab(None)
        head.config.draft_vocab_size = 0
        return DraftVocab(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), {"size": 0})
    tokens = encode_documents(tokenizer, corpus.train)  # [M]
    token_ids, counts = most_frequent(tokens, head.config.vocab_size, size)
    coverage = round(counts.sum().item() / len(tokens), 4)
    head.use_draft_vocab(token_ids)
    head.config.draft_vocab_size = size
    print(f"{job}: draft vocabulary of {size} tokens, {coverage:.1%} of the {len(tokens)} training-split tokens")
    record = {"size": size, "tokens_counted": len(tokens), "coverage": coverage, "corpus": corpus.source}
    return DraftVocab(token_ids, counts, record)


def trained_head(load: Callable[[], Head], out: Path, target: str) -> Head:
    """The head trained in `out`, as `load` reads it, checked to be `target`'s; a JobError naming
    output_dir or both targets otherwise."""
    try:
        head = load()
    except ValueError as exc:
        raise JobError(f"draft_vocab_only=true needs the head trained in output_dir={out}: {exc}") from None
    wanted = weights_sha256(Path(target))
    if head.config.target_weights_sha256 != wanted:
        raise JobError(
            f"the head in output_dir={out} was trained for the target at {head.config.target_path} "
            f"(weights sha256 {head.config.target_weights_sha256[:12]}), not target={target} ({wanted[:12]})"
        )
    return head


def write_draft_vocab(
    job: str,
    head: DraftingHead,
    out: Path,
    size: int,
    tokenizer: PreTrainedTokenizerBase,
    corpus: Corpus,
    measure: Callable[[], dict[str, Any]],
) -> Path:
    """`draft_vocab_only`: the draft vocabulary of `head` (trained in `out`, loaded without one, checked
    against its target and attached to it), and what `measure` then finds (its held-out measure with
    the vocabulary), written to `<job>.json` and `draft_vocab.safetensors`; the weights are left as they are."""
    vocab = use_draft_vocab(job, head, size, tokenizer, corpus)
    head.config.training.update(measure())
    head.config.training["draft_vocab"] = vocab.record
    vocab.save(out)
    write_weights_config(out, job, head.config)
    print(f"{job}: draft vocabulary and held-out measure written to {out / f'{job}.json'}")
    return out
