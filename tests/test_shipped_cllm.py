"""The shipped CLLM's card figures, reproduced on a small sample of the same held-out split.

Slow (about a minute on 2 cores): it scores held-out text with the target and the CLLM and decodes
Jacobi trajectories with both, as `accelgen train cllm` measured them for the card
(`jobs/assets/models/cllm/training.json`, the table in `jobs/assets/models/README.md`). A sample
is noisier than the card's 64 prompts and 100k tokens, so the figures are compared within a
tolerance: what must hold is that the shipped weights are the ones the card describes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from jobs.shipped import SHIPPED_MODELS
from jobs.train.cllm import heldout_set, measure
from jobs.train.config_fine_tune import CLLMJobConfig
from jobs.train.corpus import load_corpus
from jobs.train.model import load_float32
from jobs.train.tokenizer import load_tokenizer
from pipeline.config import load_config

CONFIG = Path(__file__).resolve().parents[1] / "jobs" / "configs" / "train_cllm.yaml"
SHIPPED_CLLM = SHIPPED_MODELS / "cllm"
SAMPLE = ["eval.prompts=12", "eval.heldout_tokens=16384"]


@pytest.mark.slow
def test_the_shipped_cllm_reproduces_its_card_on_a_sample(tmp_path: Path) -> None:
    card = json.loads((SHIPPED_CLLM / "training.json").read_text())
    config = load_config(CLLMJobConfig(), str(CONFIG), [*SAMPLE, f"output_dir={tmp_path}"])
    assert config.target == card["config"]["target"] and config.data.block_size == card["config"]["data.block_size"]
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    heldout = heldout_set(config, load_tokenizer(config.target), load_corpus(config.corpus))
    target, target_greedy = measure(load_float32(config.target, cpu, frozen=True), heldout, config)
    cllm, _ = measure(load_float32(str(SHIPPED_CLLM), cpu, frozen=True), heldout, config, target_greedy)
    shown = card["heldout"]
    # The CLLM's loss over the target's: the card's +x% within 2 points.
    ratio = cllm["loss_nats"] / target["loss_nats"]
    assert ratio == pytest.approx(shown["cllm"]["loss_nats"] / shown["target"]["loss_nats"], abs=0.02)
    agreement = shown["cllm"]["greedy_agreement_with_target"]
    assert cllm["greedy_agreement_with_target"] == pytest.approx(agreement, abs=0.05)
    for model, measured in (("target", target), ("cllm", cllm)):
        per_iteration = measured["trajectories"]["tokens_per_iteration"]
        assert per_iteration == pytest.approx(shown[model]["trajectories"]["tokens_per_iteration"], rel=0.1), model
