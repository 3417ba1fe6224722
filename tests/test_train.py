"""Training jobs: tiny runs produce loadable Hugging Face dirs, resume exactly, and split the corpus stably."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from killed_run import killed_then_rerun, same_weights
from transformers import AutoModelForCausalLM, AutoTokenizer

from jobs.train import checkpoint
from jobs.train.cli import COMMANDS, main
from jobs.train.config import CorpusConfig, LlamaShape, OptimConfig, TrainConfig
from jobs.train.corpus import is_heldout, load_corpus
from jobs.train.draft import start_from_target
from jobs.train.loop import lr_at
from jobs.train.model import build_llama
from jobs.train.samplers import Phase, WindowSampler, phase_of
from jobs.train.tokenizer import CHAT_TEMPLATE
from pipeline.config import describe
from pipeline.errors import JobError
from workers.common.model_files import weights_sha256

CORPUS = ["corpus.max_files=40", "corpus.heldout_percent=25"]  # a few stdlib files, some held out
TINY_LM = [
    *CORPUS,
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=4",
    "model.num_key_value_heads=2",
    "train.batch_size=4",
    "train.seq_len=32",
    "train.final_seq_len=64",
    "train.final_fraction=0.34",  # 6 steps: 4 on 32-token windows, 2 on 64-token windows
    "train.steps=6",
    "train.checkpoint_every=2",
    "optim.warmup_steps=2",
]


def test_schedule_warms_up_then_decays_to_the_floor() -> None:
    optim = OptimConfig(lr=1.0, min_lr_ratio=0.1, warmup_steps=4)
    assert [lr_at(s, 14, optim) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(9, 14, optim) == pytest.approx(0.55) and lr_at(14, 14, optim) == pytest.approx(0.1)


def test_windows_are_a_pure_function_of_seed_and_step() -> None:
    config = TrainConfig(steps=10, batch_size=4, seq_len=8, final_seq_len=16, final_fraction=0.2)
    assert [phase_of(s, config) for s in (0, 7, 8, 9)] == [Phase(8, 4, 0)] * 2 + [Phase(16, 2, 8)] * 2
    tokens = torch.arange(1000, dtype=torch.int32)
    first, second = WindowSampler(tokens, seed=1), WindowSampler(tokens, seed=1)
    assert torch.equal(first.batch(3, config), second.batch(3, config))
    assert first.batch(3, config).shape == (4, 9) and first.batch(9, config).shape == (2, 17)
    epoch = torch.cat([first.batch(s, config)[:, 0] for s in range(8)])  # 32 of one epoch's 124 windows
    assert len(set(epoch.tolist())) == 32 and bool((epoch.diff() != 0).all())
    assert not torch.equal(first.batch(3, config), WindowSampler(tokens, seed=2).batch(3, config))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    assert main(["tokenizer", f"output_dir={out}", "vocab_size=512", *CORPUS]) == 0
    return out


@pytest.fixture(scope="module")
def target_dir(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("target")
    assert main(["lm", f"tokenizer={tokenizer_dir}", f"output_dir={out}", *TINY_LM]) == 0
    return out


def test_heldout_rule_is_a_stable_hash_of_the_key() -> None:
    keys = [f"pkg/module_{i}.py" for i in range(10_000)]
    held = [k for k in keys if is_heldout(k, 5.0)]
    assert 400 < len(held) < 600
    assert held == [k for k in keys if is_heldout(k, 5.0)]
    assert not any(is_heldout(k, 0.0) for k in keys)
    assert is_heldout("json/decoder.py", 5.0) == is_heldout("json/decoder.py", 5.0)


def test_stdlib_split_is_stable_and_does_not_depend_on_other_files() -> None:
    small = load_corpus(CorpusConfig(max_files=100, heldout_percent=20))
    large = load_corpus(CorpusConfig(max_files=200, heldout_percent=20))
    again = load_corpus(CorpusConfig(max_files=200, heldout_percent=20))
    assert [d.key for d in large.heldout] == [d.key for d in again.heldout]
    small_keys = {d.key for d in small.train + small.heldout}
    assert [d.key for d in small.heldout] == [d.key for d in large.heldout if d.key in small_keys]
    assert large.heldout and large.train
    assert not any(part in ("test", "site-packages") for d in large.train for part in d.key.split("/")[:-1])


def test_parquet_corpus_reads_its_text_column() -> None:
    fs = fsspec.filesystem("memory")
    with fs.open("/corpus/shard.parquet", "wb") as f:
        pq.write_table(pa.table({"text": ["def f():\n    pass\n", None, "x = 1\n"]}), f)
    corpus = load_corpus(CorpusConfig(url="memory://corpus/*.parquet", heldout_percent=0.0))
    assert [(d.key, d.text) for d in corpus.train] == [
        ("shard.parquet#0", "def f():\n    pass\n"),
        ("shard.parquet#2", "x = 1\n"),
    ]
    with pytest.raises(JobError, match="no column 'content'"):
        load_corpus(CorpusConfig(url="memory://corpus/shard.parquet", text_column="content"))


def test_tokenizer_round_trips_text(tokenizer_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    for text in ["def add(a, b):\n\treturn a + b  # somme\n", "naïve café 🙂 ≠ ∑", "   \n\n  x"]:
        ids = tokenizer(text).input_ids
        assert ids[0] == tokenizer.bos_token_id == tokenizer.eos_token_id
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.pad_token_id not in (None, tokenizer.eos_token_id)


def test_tiny_lm_writes_a_plain_hugging_face_model_dir(target_dir: Path) -> None:
    for name in [
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ]:
        assert (target_dir / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(target_dir)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    assert tokenizer.chat_template == CHAT_TEMPLATE  # the trained tokenizer's template survives `train lm`
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.max_position_embeddings >= 1024 and model.config.vocab_size == len(tokenizer)
    prompt = tokenizer("import os\n", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert out.shape == (1, prompt.input_ids.shape[1] + 5)
    assert json.loads((target_dir / "training.json").read_text())["steps"] == 6


def test_interrupted_run_resumes_to_the_uninterrupted_weights(
    tokenizer_dir: Path,
    target_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    args = ["lm", f"tokenizer={tokenizer_dir}", f"output_dir={tmp_path}", *TINY_LM]
    checkpointed, rerun = killed_then_rerun(main, args, WindowSampler, 5, tmp_path, monkeypatch, capsys)
    assert checkpointed == 4 and "resuming from step 4/6" in rerun
    assert torch.load(tmp_path / "checkpoint" / checkpoint.STATE_FILE, weights_only=True)["step"] == 6
    assert same_weights(tmp_path / "model.safetensors", target_dir / "model.safetensors")


def test_a_changed_config_refuses_to_resume(
    tokenizer_dir: Path, target_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    args = ["lm", f"tokenizer={tokenizer_dir}", f"output_dir={target_dir}", *TINY_LM, "optim.lr=0.01"]
    assert main(args) == 2
    assert "optim.lr: 0.002 -> 0.01" in capsys.readouterr().err


def test_draft_distills_from_the_target_and_eval_reports_the_pair(target_dir: Path, tmp_path: Path) -> None:
    draft_dir, report = tmp_path / "draft", tmp_path / "eval.json"
    draft_shape = ["model.hidden_size=16", "model.intermediate_size=32", "model.num_hidden_layers=1"]
    assert main(["draft", f"target={target_dir}", f"output_dir={draft_dir}", *TINY_LM, *draft_shape]) == 0
    draft = AutoModelForCausalLM.from_pretrained(draft_dir)
    assert draft.config.num_hidden_layers == 1 and draft.config.vocab_size == len(
        AutoTokenizer.from_pretrained(draft_dir)
    )
    record = json.loads((draft_dir / "training.json").read_text())
    assert record["config"]["target_weights_sha256"] == weights_sha256(target_dir)

    args = [
        "eval",
        f"model={target_dir}",
        f"draft={draft_dir}",
        *CORPUS,
        "seq_len=64",
        "max_tokens=2048",
        "decode_tokens=4",
        f"report={report}",
    ]
    assert main(args) == 0
    numbers = json.loads(report.read_text())
    assert numbers["heldout_tokens"] > 0 and 0.0 <= numbers["greedy_agreement"] <= 1.0
    for key in [
        "loss_nats",
        "unigram_loss_nats",
        "draft_loss_nats",
        "decode_tokens_per_s",
        "draft_decode_tokens_per_s",
    ]:
        assert 0.0 < numbers[key] < float("inf"), key


def test_a_draft_does_not_resume_on_a_checkpoint_distilled_from_other_target_weights(
    target_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    target = tmp_path / "target"
    shutil.copytree(target_dir, target)
    args = ["draft", f"target={target}", f"output_dir={tmp_path / 'draft'}", *TINY_LM, "model.hidden_size=16"]
    args += ["model.intermediate_size=32", "model.num_hidden_layers=1"]
    assert main(args) == 0
    retrained = AutoModelForCausalLM.from_pretrained(target)
    with torch.no_grad():
        retrained.get_output_embeddings().weight.mul_(1.01)
    retrained.save_pretrained(target)  # same path and config, other weights: a retrained target
    capsys.readouterr()
    assert main(args) == 2
    assert "target_weights_sha256" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_lists_every_key_with_its_default(name: str, capsys: pytest.CaptureFixture) -> None:
    assert main([name, "--help"]) == 0
    text = capsys.readouterr().out
    for key, default, _ in describe(COMMANDS[name].config()):
        assert f"  {key} = {default}" in text


def test_user_errors_name_the_problem(capsys: pytest.CaptureFixture) -> None:
    assert main(["pretrain"]) == 2
    assert "available: tokenizer, lm, draft, eval" in capsys.readouterr().err
    assert main(["lm", "tokenizer=x", "output_dir=y", "model.depth=3"]) == 2
    assert "model.depth" in capsys.readouterr().err
    assert main(["lm", "tokenizer=/nonexistent", "output_dir=y", "train.precision=fp8"]) == 2
    assert "train.precision" in capsys.readouterr().err


def test_a_draft_starts_from_the_target_layers_it_names(target_dir: Path) -> None:
    target = AutoModelForCausalLM.from_pretrained(target_dir)
    shape = target.config
    draft = build_llama(
        LlamaShape(shape.hidden_size, shape.intermediate_size, 2, shape.num_attention_heads, shape.num_key_value_heads),
        AutoTokenizer.from_pretrained(target_dir),
        seed=0,
    )
    last = shape.num_hidden_layers - 1
    start_from_target(draft, target, [0, last])
    mine, theirs = draft.state_dict(), target.state_dict()
    for key in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        assert torch.equal(mine[key], theirs[key]), key
    for layer, source in ((0, 0), (1, last)):
        for name, value in draft.model.layers[layer].state_dict().items():
            assert torch.equal(value, theirs[f"model.layers.{source}.{name}"]), (layer, name)
    with pytest.raises(JobError, match=r"one target layer \(0\.\." + str(last) + r"\) per draft layer"):
        start_from_target(draft, target, [0])
    narrow = build_llama(LlamaShape(16, 32, 1, 2, 1), AutoTokenizer.from_pretrained(target_dir), seed=0)
    with pytest.raises(JobError, match="hidden_size 16 vs"):
        start_from_target(narrow, target, [0])
