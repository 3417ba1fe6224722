"""τ floors of every shipped drafter on the shipped target: a drafter that drafts from the wrong
position, stops drafting or raises still emits the target's tokens, and only its τ tells.

The setting, the same for every drafter: the first 8 sample prompts (`jobs/assets/prompts`),
tokenised with the shipped tokenizer, decoded in one batch for 32 greedy tokens in float64 on the
CPU, each strategy with its defaults and no controller (`strategy.adaptive=false`), so τ is the same
number on every run. `TAU` holds τ as measured here (`pytest -s` prints it) and its floor, 0.9 of
it; the model card (`jobs/assets/models/README.md`, "τ in the test setting") records the same table
beside its held-out figures. A change that moves τ measures both again.
"""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest
import torch
from drafted import assert_drafted
from transformers import AutoTokenizer

from jobs.shipped import SAMPLE_PROMPTS, SHIPPED_TARGET, shipped
from strategies import registry
from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.options import StrategyOptions
from strategies.runtime.sampling import SamplingParams
from workers.model_loading import load_models

PROMPTS, NEW_TOKENS = 8, 32
CARD = (SHIPPED_TARGET.parent / "README.md").read_text()

# drafter: (strategy, its options, τ measured in this file's setting, floor = 0.9 × τ)
TAU = {
    "draft model": ("speculative", {}, 3.26, 2.93),
    "CMLM": ("speculative", {"speculative.drafter": "cmlm"}, 1.75, 1.57),
    "prompt lookup": ("prompt_lookup", {}, 2.02, 1.82),
    "Lookahead": ("lookahead", {}, 1.76, 1.58),
    "Medusa heads": ("medusa", {}, 2.01, 1.81),
    "blockwise heads": ("blockwise", {}, 1.82, 1.64),
    "EAGLE chain": ("eagle", {"eagle.tree": "chain"}, 3.22, 2.9),
    "EAGLE static": ("eagle", {"eagle.tree": "static"}, 3.4, 3.06),
    "EAGLE dynamic": ("eagle", {"eagle.tree": "dynamic"}, 3.4, 3.06),
    "exit heads": ("self_speculative", {}, 1.96, 1.76),
}


@pytest.fixture(scope="module")
def shipped_run():
    """The shipped target with every drafting model, the batch's requests and its greedy tokens."""
    kinds = {kind: str(shipped(kind)) for kind in ("draft", "cmlm", "heads", "eagle", "exits")}
    models = load_models(str(SHIPPED_TARGET), torch.float64, torch.device("cpu"), kinds).models
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_TARGET)
    texts = [row["prompt"] for row in pq.read_table(SAMPLE_PROMPTS).to_pylist()[:PROMPTS]]
    requests = [RowRequest(prompt=tokenizer(t)["input_ids"], key=i) for i, t in enumerate(texts)]
    params = GenerationParams(NEW_TOKENS, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    reference = [r.tokens for r in AutoregressiveStrategy(models.target).generate(requests, params).rows]
    return models, requests, params, reference


def _options(name: str, settings: dict[str, str]) -> StrategyOptions:
    options = StrategyOptions(name=name, adaptive=False)
    for key, value in settings.items():
        section, field = key.split(".")
        setattr(getattr(options, section), field, value)
    return options


@pytest.mark.parametrize("drafter", list(TAU))
def test_a_shipped_drafter_reaches_its_tau_floor(shipped_run, drafter):
    """Catches the planted bugs "EAGLE head fed (feature t, token t)" (EAGLE τ falls to about 1),
    "Medusa heads read the previous step's hidden state" (Medusa and blockwise τ fall below their
    floors), and, as faults, "EAGLE head cache never truncated" and "Medusa's proposer raises from its
    third draft on"."""
    models, requests, params, reference = shipped_run
    name, settings, measured, floor = TAU[drafter]
    out = registry.create(_options(name, settings), models).generate(requests, params)
    print(f"{drafter}: τ {out.stats['tau']} (recorded {measured}, floor {floor})")
    assert [r.tokens for r in out.rows] == reference
    assert_drafted(out.stats, tau_at_least=floor)


def test_the_model_card_records_the_same_taus_and_floors():
    """The card's "τ in the test setting" table: one row per drafter, τ and floor as `TAU` has them."""
    for drafter, (_, _, measured, floor) in TAU.items():
        row = next(line for line in CARD.splitlines() if line.startswith(f"| {drafter} |"))
        numbers = [float(x) for x in re.findall(r"\d+\.\d+", row)]
        assert numbers == [measured, floor], drafter
        assert floor == round(0.9 * measured, 2), drafter
