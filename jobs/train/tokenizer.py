"""Byte-level BPE tokenizer, trained on the corpus' train split and saved as a transformers fast tokenizer.

Byte-level: every byte string has an encoding, so no prompt is ever untokenizable. One special
token, `<|endoftext|>`, both separates documents in training and starts every encoded text (as
BOS): a prompt then looks exactly like the start of a training document. `<|pad|>` is separate,
so padding can never be mistaken for an end of text.

The tokenizer carries a small chat template (`CHAT_TEMPLATE`) so that chat-formatted prompts
(`input.messages_column`) render: BOS, then each message as a `<|role|>` line followed by its
content and a newline, then `<|assistant|>` and a newline as the generation prompt. The markers are
plain text, not special tokens: the shipped models were trained on code, not on conversations.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from jobs.train.config import TokenizerJobConfig
from jobs.train.corpus import Document, load_corpus
from pipeline.errors import JobError

EOS = "<|endoftext|>"
PAD = "<|pad|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def train_tokenizer(config: TokenizerJobConfig) -> Path:
    """Train the tokenizer described by `config`, save it to `config.output_dir`, and return that path."""
    if config.vocab_size < 260:
        raise JobError(f"vocab_size={config.vocab_size}: use at least 260 (256 bytes plus special tokens)")
    corpus = load_corpus(config.corpus)
    start = time.perf_counter()
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator((d.text for d in corpus.train), trainer, length=len(corpus.train))
    eos_id = bpe.token_to_id(EOS)
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{EOS} $A", pair=f"{EOS} $A {EOS} $B", special_tokens=[(EOS, eos_id)]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=EOS, eos_token=EOS, pad_token=PAD)
    tokenizer.chat_template = CHAT_TEMPLATE
    out = Path(config.output_dir)
    tokenizer.save_pretrained(out)
    heldout_bytes = sum(len(d.text.encode()) for d in corpus.heldout)
    heldout_tokens = len(encode_documents(tokenizer, corpus.heldout)) - len(corpus.heldout)  # minus separators
    print(
        f"tokenizer: {len(tokenizer)} tokens from {len(corpus.train)} documents of {corpus.source} "
        f"in {time.perf_counter() - start:.1f} s; held-out: {heldout_bytes / max(heldout_tokens, 1):.2f} "
        f"bytes/token; saved to {out}"
    )
    return out


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """The tokenizer saved in local directory `path`, checked to have the EOS and pad tokens training relies on."""
    if not Path(path).is_dir():
        raise JobError(f"{path} is not a directory; run `accelgen train tokenizer` (or `train lm`) to create it")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise JobError(f"{path} holds no loadable tokenizer ({exc}); run `accelgen train tokenizer`") from None
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise JobError(f"tokenizer at {path} lacks an EOS or pad token; retrain it with `accelgen train tokenizer`")
    return tokenizer


def encode_documents(tokenizer: PreTrainedTokenizerBase, documents: list[Document]) -> torch.Tensor:
    """All documents as one packed token stream, each starting with `<|endoftext|>`: [N] int32.

    The separator ends the previous document and starts the next, so the model learns both to stop
    and to begin a text from it.
    """
    encodings = tokenizer.backend_tokenizer.encode_batch([d.text for d in documents], add_special_tokens=False)
    bos = tokenizer.eos_token_id
    return torch.tensor([t for e in encodings for t in (bos, *e.ids)], dtype=torch.int32)
