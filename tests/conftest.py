"""Shared fixtures: a tiny random-weight Llama with a tiny byte-level BPE tokenizer, built locally."""

from __future__ import annotations

import gc
import inspect
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TOKENIZER_TEXT = [inspect.getsource(inspect), inspect.getsource(pytest)] * 2
TINY_CONTEXT = 96


def build_tiny_model(path: Path, seed: int = 0, layers: int = 2, hidden: int = 32) -> Path:
    """Save a random Llama (context TINY_CONTEXT) and a 300-token byte-level BPE tokenizer to `path`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TOKENIZER_TEXT, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(path)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_CONTEXT,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def _collector_unfrozen():
    """A test that builds an actor or a bench in this process freezes its heap
    (`strategies/runtime/heap.py`); the tests after it find the collector as they would have."""
    yield
    gc.unfreeze()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A smaller random model with the same tokenizer: a draft that is mostly wrong."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-draft"), seed=1, layers=1, hidden=16)
