"""`train cmlm`: the distilled CMLM is a plain model folder that learns the target's continuations.

Whether more passes help (T=4 over T=1) is not asserted here: on the tiny random-weight target the
difference is within the noise of the seed (at 300 steps, T=1 / T=4 agreement 0.127 / 0.125,
0.174 / 0.199, 0.148 / 0.141 for seeds 0, 1, 2). The refinement loop itself is specified on literal
probabilities in tests/test_mask_predict.py; the shipped CMLM's curve over T is in its model card.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from jobs.train.cli import main
from jobs.train.cmlm import ExampleSampler, ends_at_eos, masked_batch
from jobs.train.config import TrainConfig
from jobs.train.config_fine_tune import CMLMJobConfig
from strategies.artifacts.cmlm import CMLMConfig, read_config

TINY_CMLM = [
    "corpus.max_files=40",
    "corpus.heldout_percent=25",
    "shape.layers=2",
    "shape.max_length=8",
    "data.prompts=64",
    "data.prompt_tokens=24",
    "data.min_context=4",
    "data.continuation=16",
    "data.batch_size=32",
    "eval.prompts=64",
    "eval.iterations=[1,4]",
    "train.steps=300",
    "train.batch_size=16",
    "train.checkpoint_every=100",
    "train.threads=1",
    "optim.lr=0.003",
    "optim.warmup_steps=10",
]


def test_a_trained_cmlm_loads_with_plain_transformers_and_learned_the_targets_output(tiny_model_dir: Path, tmp_path):
    out = tmp_path / "cmlm"
    assert main(["cmlm", f"target={tiny_model_dir}", f"output_dir={out}", *TINY_CMLM]) == 0
    config = read_config(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 2 and model.get_output_embeddings().out_features == len(tokenizer)
    assert tokenizer.convert_tokens_to_ids(["<mask>", "<length>", "<len_1>", "<len_8>"]) == [
        config.mask_token_id,
        config.length_token_id,
        config.first_length_token_id,
        config.length_id(8),
    ]
    target = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert config.content_vocab_size == len(target) and config.max_length == 8
    record = json.loads((out / "training.json").read_text())
    before, after = record["heldout_agreement"]["before"], record["heldout_agreement"]["after"]
    # Untrained, it agrees with the target nowhere; trained, on about an eighth of the held-out tokens.
    assert before == {"T=1": 0.0, "T=4": 0.0}
    assert min(after.values()) > 0.08, record["heldout_agreement"]


def test_examples_are_blocks_of_the_continuation_after_their_context():
    # Two continuations after 4-token prompts: the first ends with EOS (0) after 3 tokens, the second is cut.
    sequences = torch.tensor([[1, 2, 3, 4, 5, 6, 0, 9, 9, 9], [1, 2, 3, 4, 7, 8, 7, 8, 7, 8]])
    data = ends_at_eos(sequences, 4, eos_id=0)
    assert data.lengths.tolist() == [3, 6] and data.ended.tolist() == [True, False]
    config = CMLMJobConfig(target="t", output_dir="o")
    config.shape.max_length, config.data.min_context, config.data.short_block_share = 4, 2, 0.0
    sampler = ExampleSampler(data, config)
    assert sampler.last_split.tolist() == [2, 2]  # a cut continuation offers only splits with a full block after
    train = TrainConfig(steps=1, batch_size=32)
    examples = sampler.batch(0, train)
    assert torch.equal(examples, sampler.batch(0, train))  # a pure function of (seed, step)
    for row, split, context, size, length, _ in examples.tolist():
        assert size == length == min(4, int(data.lengths[row]) - split) and 2 <= context <= 4 + split
    spec = CMLMConfig(
        content_vocab_size=20, mask_token_id=20, length_token_id=21, first_length_token_id=22, max_length=4
    )
    inputs, allowed, marker, where, truth = masked_batch(data, spec, examples, seed=0)
    width = inputs.shape[1]
    for b, (row, split, context, size, _, _) in enumerate(examples.tolist()):
        assert inputs[b, context] == spec.length_token_id and inputs[b, context + 1] == spec.length_id(size)
        assert inputs[b, :context].tolist() == sequences[row, 4 + split - context : 4 + split].tolist()
        assert allowed[b, context, context + 1 :].sum() == 0  # LENGTH does not see the block
        assert bool(allowed[b, context + 1 : context + 2 + size, context + 1 : context + 2 + size].all())
        assert marker[b] == b * width + context
    rows, columns = where // width, where % width
    assert torch.equal(inputs[rows, columns], torch.full_like(truth, spec.mask_token_id))
    for (r, c), token in zip(zip(rows.tolist(), columns.tolist(), strict=True), truth.tolist(), strict=True):
        row, split, context = examples[r, :3].tolist()
        assert token == sequences[row, 4 + split + c - context - 2]  # block position c - context - 2
