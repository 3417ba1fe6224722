"""`train lm`: the target language model, a Llama trained from scratch on next-token prediction."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from jobs.train.config import LMJobConfig, check_train
from jobs.train.corpus import load_corpus
from jobs.train.loop import train_and_export
from jobs.train.model import build_llama
from jobs.train.tokenizer import encode_documents, load_tokenizer


def next_token_loss(model: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats/token) of predicting windows[:, 1:] from windows[:, :-1]."""
    logits = model(input_ids=windows[:, :-1]).logits  # [B, T, V]
    return F.cross_entropy(logits.float().flatten(0, 1), windows[:, 1:].flatten())


def train_lm(config: LMJobConfig) -> Path:
    """Train the target described by `config`; returns its model directory."""
    check_train(config.train, config.model)
    tokenizer = load_tokenizer(config.tokenizer)
    corpus = load_corpus(config.corpus)
    tokens = encode_documents(tokenizer, corpus.train)  # [N]
    model = build_llama(config.model, tokenizer, config.train.seed)
    return train_and_export("lm", config, model, next_token_loss, tokens, tokenizer, corpus.source)
