"""`train heads`: heads with weights of their own, self-distillation that learns, exact resumption, a folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from killed_run import killed_then_rerun, same_weights
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from jobs.train import checkpoint
from jobs.train.cli import main
from jobs.train.config import CorpusConfig, TrainConfig
from jobs.train.corpus import load_corpus
from jobs.train.draft_vocab import most_frequent
from jobs.train.heads import DATA_SUBDIR, IGNORE, head_labels, heads_loss, hidden_windows
from jobs.train.samplers import SequenceSampler
from jobs.train.tokenizer import encode_documents, load_tokenizer
from strategies.artifacts.configs import HeadsConfig, read_heads_config
from strategies.artifacts.draft_vocab import DRAFT_VOCAB_FILE
from strategies.artifacts.heads import CONFIG_FILE, WEIGHTS_FILE, DraftHeads, load_heads
from workers.common.model_files import weights_sha256

PROMPT, CONTINUATION, NUM_HEADS = 8, 16, 4
TINY_HEADS = [
    "corpus.max_files=40",
    "corpus.heldout_percent=25",
    "data.sequences=8",
    f"data.prompt_tokens={PROMPT}",
    f"data.continuation_tokens={CONTINUATION}",
    "data.batch_size=8",
    "data.eval_sequences=4",
    "train.steps=6",
    "train.batch_size=4",
    "train.checkpoint_every=2",
    "optim.lr=0.01",
    "optim.warmup_steps=2",
]


@pytest.fixture(scope="module")
def heads_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("heads")
    assert main(["heads", f"target={tiny_model_dir}", f"output_dir={out}", *TINY_HEADS]) == 0
    return out


@pytest.mark.parametrize("shared", [True, False], ids=["shared-lm-head", "own-projections"])
def test_each_head_has_weights_of_its_own(shared: bool) -> None:
    torch.manual_seed(0)
    heads = DraftHeads(HeadsConfig(num_heads=3, hidden_size=16, vocab_size=40, shared_lm_head=shared))
    lm_head = torch.nn.Parameter(torch.randn(40, 16))  # [V, H], a Parameter as a model's LM head is
    heads.use_lm_head(lm_head)
    heads.start_projections(lm_head)
    assert "lm_head" not in heads.state_dict()  # the target's LM head is never the heads' own weight
    params = list(heads.parameters())
    assert len({p.data_ptr() for p in params}) == len(params)
    hidden = torch.randn(2, 5, 16)  # [B, T, H]
    before = heads(hidden)  # [K, B, T, V]
    assert all(torch.allclose(logits, hidden @ lm_head.T, atol=1e-5) for logits in before)  # untrained: LM head
    with torch.no_grad():
        heads.blocks[1][0].linear.weight.normal_()
    after = heads(hidden)  # [K, B, T, V]
    assert torch.equal(before[0], after[0]) and torch.equal(before[2], after[2])
    assert not torch.allclose(before[1], after[1])


def test_labels_are_the_generated_tokens_2_plus_i_ahead() -> None:
    sequences = torch.arange(10).unsqueeze(0)  # [1, L]: a 4-token prompt, 6 generated tokens
    labels = head_labels(sequences, prompt_tokens=4, num_heads=2)  # [1, K, W], positions t = 1 … 7
    assert labels[0].tolist() == [[IGNORE, 4, 5, 6, 7, 8, 9], [4, 5, 6, 7, 8, 9, IGNORE]]


def test_sequence_batches_are_a_pure_function_of_seed_and_step() -> None:
    config = TrainConfig(batch_size=3)
    first, again = SequenceSampler(7, seed=1), SequenceSampler(7, seed=1)
    assert torch.equal(first.batch(4, config), again.batch(4, config))
    epoch = torch.cat([first.batch(s, config) for s in range(7)])[:7]  # the first 7 picks: one epoch
    assert sorted(epoch.tolist()) == list(range(7))


def test_training_lowers_the_loss(heads_dir: Path, tiny_model_dir: Path) -> None:
    target = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    sequences = torch.load(heads_dir / "checkpoint" / DATA_SUBDIR / checkpoint.STATE_FILE)["sequences"]  # [N, L]
    assert sequences.shape == (8, PROMPT + CONTINUATION)
    hidden = hidden_windows(target, sequences, PROMPT, NUM_HEADS, batch_size=8)  # [N, W, H]
    objective = heads_loss(hidden, head_labels(sequences, PROMPT, NUM_HEADS), decay=0.8)
    untrained = DraftHeads(read_heads_config(heads_dir))
    trained = load_heads(heads_dir, torch.float32, torch.device("cpu"))
    for heads in (untrained, trained):
        heads.use_lm_head(target.lm_head.weight)
    everything = torch.arange(len(sequences))
    with torch.no_grad():
        assert objective(trained, everything).item() < objective(untrained, everything).item()


def test_saved_folder_loads_and_names_its_target(heads_dir: Path, tiny_model_dir: Path) -> None:
    assert sorted(p.name for p in heads_dir.iterdir()) == sorted(["checkpoint", CONFIG_FILE, WEIGHTS_FILE])
    heads = load_heads(heads_dir, torch.float32, torch.device("cpu"))
    config = heads.config
    assert config.target_weights_sha256 == weights_sha256(tiny_model_dir)
    assert config.target_path == str(tiny_model_dir)
    assert (config.num_heads, config.num_layers, config.shared_lm_head) == (NUM_HEADS, 1, True)
    assert all(name.startswith("blocks.") for name in load_file(heads_dir / WEIGHTS_FILE))
    training = config.training
    assert training["steps"] == 6 and training["tokens_seen"] == 6 * 4 * CONTINUATION
    assert training["generated_tokens"] == 8 * CONTINUATION and len(training["heldout_accuracy"]) == NUM_HEADS
    assert {"wall_s", "torch", "transformers", "config"} <= training.keys()


def test_interrupted_run_resumes_to_the_uninterrupted_heads(
    heads_dir: Path,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    args = ["heads", f"target={tiny_model_dir}", f"output_dir={tmp_path}", *TINY_HEADS]
    checkpointed, rerun = killed_then_rerun(main, args, SequenceSampler, 5, tmp_path, monkeypatch, capsys)
    assert checkpointed == 4 and "reusing the 8 generated sequences" in rerun and "resuming from step 4/6" in rerun
    assert same_weights(tmp_path / WEIGHTS_FILE, heads_dir / WEIGHTS_FILE)


def test_eval_reports_top1_and_top5_per_head(heads_dir: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    report = tmp_path / "heads-eval.json"
    sizes = [f"prompt_tokens={PROMPT}", f"continuation_tokens={CONTINUATION}", "sequences=4", "batch_size=8"]
    assert main(["heads-eval", f"heads={heads_dir}", *TINY_HEADS[:2], *sizes, f"report={report}"]) == 0
    accuracy = json.loads(report.read_text())
    assert [a["head"] for a in accuracy] == list(range(NUM_HEADS))
    assert all(0.0 <= a["top1"] <= a["top5"] <= 1.0 for a in accuracy)
    assert accuracy == read_heads_config(heads_dir).training["heldout_accuracy"]  # the training job's own measurement


def test_heads_refuse_another_target(heads_dir: Path, tiny_draft_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["heads-eval", f"heads={heads_dir}", f"target={tiny_draft_dir}", *TINY_HEADS[:2]]) == 2
    assert "trained for another target" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("data.prompt_tokens=4", "data.prompt_tokens"),
        ("data.continuation_tokens=90", "data.continuation_tokens"),
        ("data.sequences=0", "data.sequences"),
        ("loss_decay=0", "loss_decay"),
        ("train.precision=fp8", "train.precision"),
        ("draft_vocab=100000", "draft_vocab"),
        ("heads.shared_lm_head=false draft_vocab=8", "heads.shared_lm_head"),
    ],
)
def test_user_errors_name_the_key(
    override: str, key: str, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    args = ["heads", f"target={tiny_model_dir}", f"output_dir={tmp_path}", *TINY_HEADS, *override.split()]
    assert main(args) == 2
    assert key in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything was generated or written


def test_draft_vocab_only_writes_the_corpus_most_frequent_tokens_and_never_the_weights(
    heads_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Heads trained without a draft vocabulary are given one, and their held-out accuracy is measured
    again among its tokens; the weights stay as trained. 0 takes it away again."""
    out = tmp_path / "heads"
    shutil.copytree(heads_dir, out, ignore=shutil.ignore_patterns("checkpoint"))
    weights = (out / WEIGHTS_FILE).read_bytes()
    args = ["heads", f"target={tiny_model_dir}", f"output_dir={out}", *TINY_HEADS, "draft_vocab_only=true"]
    assert main([*args, "draft_vocab=32"]) == 0
    config = read_heads_config(out)
    corpus = load_corpus(CorpusConfig(max_files=40, heldout_percent=25))
    tokens = encode_documents(load_tokenizer(str(tiny_model_dir)), corpus.train)
    expected, _ = most_frequent(tokens, config.vocab_size, 32)
    assert config.draft_vocab_size == 32 and torch.equal(load_file(out / DRAFT_VOCAB_FILE)["token_ids"], expected)
    assert torch.equal(load_heads(out, torch.float32, torch.device("cpu")).draft_ids, expected)
    accuracy = config.training["heldout_accuracy"]
    assert len(accuracy) == NUM_HEADS and all(0.0 <= a["top1"] <= a["top5"] <= 1.0 for a in accuracy)
    assert config.training["draft_vocab"]["size"] == 32
    assert config.training["train_loss"] == read_heads_config(heads_dir).training["train_loss"]  # the record is kept
    assert (out / WEIGHTS_FILE).read_bytes() == weights
    assert main([*args, "draft_vocab=0"]) == 0
    assert read_heads_config(out).draft_vocab_size == 0 and not (out / DRAFT_VOCAB_FILE).exists()
