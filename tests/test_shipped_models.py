"""The shipped family loads with plain transformers, its tokenizer round-trips, and it matches its card."""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from jobs.shipped import SHIPPED_MODELS, SHIPPED_TARGET, shipped
from workers.common.model_files import weights_sha256

CARD = (SHIPPED_TARGET.parent / "README.md").read_text()
FAMILY = sorted(folder for folder in SHIPPED_MODELS.iterdir() if folder.is_dir())


def _card_row(label: str) -> list[str]:
    """The cells of the model card's table row starting with `label`: [target, draft]."""
    line = next(line for line in CARD.splitlines() if line.startswith(f"| {label}"))
    return [cell.strip() for cell in line.strip("|").split("|")[1:]]


@pytest.mark.parametrize(("column", "path"), [(0, SHIPPED_TARGET), (1, shipped("draft"))], ids=["target", "draft"])
def test_config_matches_the_model_card(column, path):
    config = AutoConfig.from_pretrained(path)
    hidden, layers, mlp = (int(x) for x in re.findall(r"\d+", _card_row("hidden size")[column]))
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (hidden, layers, mlp)
    heads = [int(x) for x in re.findall(r"\d+", _card_row("attention heads")[column])]
    assert heads[:2] == [config.num_attention_heads, config.num_key_value_heads]
    assert f"{config.max_position_embeddings} tokens" == _card_row("context")[column]
    model = AutoModelForCausalLM.from_pretrained(path)
    millions = float(re.findall(r"[\d.]+", _card_row("parameters")[column])[0])
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 2) == millions
    assert config.model_type == "llama" and config.max_position_embeddings >= 1024


def test_tokenizer_round_trips_and_the_models_agree_on_it():
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_TARGET)
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(shipped("draft")).get_vocab()
    text = 'def f(x):\n    """Return x — ünïcødé, 汉字, 🙂."""\n    return x\t# done\n'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token_id is not None and tokenizer.pad_token_id is not None


CODE = (
    "def mean(values):\n"
    '    """The arithmetic mean of a non-empty list."""\n'
    "    total = 0\n"
    "    for value in values:\n"
    "        total += value\n"
    "    return total / len(values)\n"
)


@pytest.mark.parametrize("path", [SHIPPED_TARGET, shipped("draft")], ids=["target", "draft"])
def test_the_models_have_learned_python(path):
    """Far below a uniform guess's ln(8192) = 9.0 nats a token on ordinary code (the card's held-out
    losses: 3.5 and 4.2), and a function's header is continued by its indented body."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    ids = torch.tensor([tokenizer(CODE)["input_ids"]])
    with torch.inference_mode():
        assert float(model(ids, labels=ids).loss) < 4.5
        prompt = torch.tensor([tokenizer("def add(a, b):")["input_ids"]])
        out = model.generate(prompt, max_new_tokens=8, do_sample=False)
    assert tokenizer.decode(out[0, prompt.shape[1] :]).startswith("\n    ")


FAMILY_LIMIT_MB = 80.0  # the whole shipped family, every model and artifact: it travels with the repository


def test_the_shipped_family_stays_under_its_size_limit():
    sizes = {folder.name: sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6 for folder in FAMILY}
    total = sum(f.stat().st_size for f in SHIPPED_MODELS.rglob("*") if f.is_file()) / 1e6
    print(f"shipped family: {total:.1f} MB in all (" + ", ".join(f"{n} {mb:.1f}" for n, mb in sizes.items()) + ")")
    assert total < FAMILY_LIMIT_MB, f"the shipped family is {total:.1f} MB, over its {FAMILY_LIMIT_MB:.0f} MB limit"


def _target_hashes_named(folder):
    """Every `target_weights_sha256` a shipped folder's JSON records (its artifact file, its training record)."""
    found = []

    def walk(value):
        if isinstance(value, dict):
            found.extend(v for k, v in value.items() if k == "target_weights_sha256")
            for v in value.values():
                walk(v)

    for record in folder.glob("*.json"):
        walk(json.loads(record.read_text()))
    return found


@pytest.mark.parametrize("folder", [f for f in FAMILY if f != SHIPPED_TARGET], ids=lambda f: f.name)
def test_every_shipped_model_was_trained_on_the_shipped_target(folder):
    """A retrained target must be shipped with everything trained on it retrained too: heads, exits and
    EAGLE are refused with other target weights, and a draft, CLLM or CMLM would silently serve it worse."""
    named = _target_hashes_named(folder)
    assert named, f"{folder.name} records no target_weights_sha256"
    assert set(named) == {weights_sha256(SHIPPED_TARGET)}, f"{folder.name} was trained on other target weights"
