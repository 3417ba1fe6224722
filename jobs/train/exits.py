"""`train exits`: exit heads at intermediate layers of the frozen target, for CALM and self-speculation.

An exit (`strategies.artifacts.exits`) reads the residual stream after the target's first l layers and must
guess what the target's last layer will say there, so its label is the target's own final next-token
distribution at every position of a corpus window (soft labels: KL(p_L ‖ p_l), which also teaches
the exit how sure the final layer is). The target is frozen; a step runs it once over the batch
through the lean forward (`LayerPass`), keeping each exit layer's state, and trains only the exits:
norms started from the final norm, low-rank adapters started at zero (so training starts from the
logit lens) and, optionally, CALM's confidence classifier, a logistic unit trained with binary
cross-entropy on "this exit's argmax equals the final layer's". That cross-entropy is class-balanced
(`balanced_bce`): at the shallow exits most positions disagree, and a plainly weighted loss is
minimised by a classifier that always answers "no", which never lets CALM exit. The shared LM head
is the target's and is never trained or saved.

What the exits are worth for early exit is their agreement with the final layer, measured on
held-out windows, per layer, for the trained exits and for the logit lens they started from; both
are printed and recorded in exits.json, with each classifier's accuracy, its balanced accuracy (the
mean of its accuracy on agreeing and on disagreeing positions) and the accuracy of always answering
"no" beside them, the baseline a classifier must beat.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from jobs.train.config import check_loop
from jobs.train.config_heads import ExitsJobConfig
from jobs.train.corpus import load_corpus
from jobs.train.loop import Objective, single_phase, train, versions
from jobs.train.model import count_parameters
from jobs.train.on_target import start_on_target
from jobs.train.samplers import WindowSampler
from jobs.train.tokenizer import encode_documents
from pipeline.errors import JobError
from strategies.artifacts.exits import ExitHeads, untrained_exits
from strategies.runtime import llama_forward
from strategies.runtime.runner import ModelRunner


def train_exits(config: ExitsJobConfig) -> Path:
    """Train the exits described by `config` on its frozen target; returns the exits' directory."""
    run = start_on_target(config, frozen=True)
    target, tokenizer = run.target, run.tokenizer
    out, checkpoint_dir, fingerprint = run.output_dir, run.checkpoint_dir, run.fingerprint
    layers = check_exits(config, target)
    corpus = load_corpus(config.corpus)
    tokens = encode_documents(tokenizer, corpus.train)  # [N]
    heldout = encode_documents(tokenizer, corpus.heldout)  # [M]
    runner = ModelRunner(target)
    torch.manual_seed(config.train.seed)
    exits = untrained_exits(target, layers, config.exits.adapter_rank, config.exits.classifier)
    exits.config.target_path = config.target
    exits.config.target_weights_sha256 = fingerprint["target_weights_sha256"]
    windows = heldout_windows(heldout, config.eval_windows, config.train.seq_len)  # [E, T]
    lens = layer_agreement(exits, runner, windows, config.train.batch_size)
    print(
        f"exits after layers {layers} of {runner.num_layers}: {count_parameters(exits) / 1e3:.1f} K parameters; "
        f"{len(tokens) / 1e6:.2f} M training tokens from {corpus.source}; checkpoints in {checkpoint_dir}"
    )
    summary = train(
        exits,
        exits_loss(runner, exits, config.classifier_weight),
        WindowSampler(tokens, config.train.seed),
        single_phase(config.train, config.train.seq_len),
        config.optim,
        checkpoint_dir,
        fingerprint,
    )
    exits.eval()
    trained = layer_agreement(exits, runner, windows, config.train.batch_size)
    report = [{**t, "logit_lens_agreement": lens_row["agreement"]} for t, lens_row in zip(trained, lens, strict=True)]
    print_agreement(report)
    exits.config.training = {
        "job": "exits",
        "config": fingerprint,
        "corpus": corpus.source,
        "parameters": count_parameters(exits),
        **asdict(summary),
        "heldout_windows": len(windows),
        "heldout_tokens": int(windows.numel()),
        "heldout_agreement": report,
        **versions(),
    }
    exits.save(out)
    print(f"exits: {summary.steps} steps in {summary.wall_s:.0f} s; loss {summary.train_loss:.3f}; saved to {out}")
    return out


def check_exits(config: ExitsJobConfig, target: torch.nn.Module) -> list[int]:
    """The exit layers (the config's, or every inner one) after checking the config against `target`."""
    if not llama_forward.supports(target):
        raise JobError(f"target={config.target!r}: exits train on the lean forward's Llama-family models only")
    num_layers = target.config.num_hidden_layers
    layers = sorted(config.exits.layers) or list(range(1, num_layers))
    if not layers or layers[0] < 1 or layers[-1] >= num_layers or len(set(layers)) != len(layers):
        raise JobError(f"exits.layers={config.exits.layers}: use distinct layers in 1..{num_layers - 1}")
    if config.exits.adapter_rank < 0 or config.classifier_weight < 0 or config.eval_windows < 1:
        raise JobError("exits.adapter_rank and classifier_weight must be >= 0, eval_windows >= 1")
    check_loop(config.train, "seq_len")
    if config.train.seq_len > target.config.max_position_embeddings:
        raise JobError(f"train.seq_len={config.train.seq_len} exceeds the target's context")
    return layers


def layer_states(runner: ModelRunner, exits: ExitHeads, ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The target over windows `ids` [B, T]: the residual stream after each exit's layer ([B, T, H] each),
    and the final layer's logits [B, T, V]; no gradient (the target is frozen)."""
    b, t = ids.shape
    kv = runner.new_kv(b)
    positions = torch.arange(t, device=ids.device).expand(b, t)
    step = runner.layer_pass(kv, ids, positions, torch.ones(b, t, dtype=torch.bool, device=ids.device))
    states = [step.run(layer).clone() for layer in exits.layers]  # clone: out of inference mode, for autograd
    step.run(runner.num_layers)
    return states, step.head().clone()


def exits_loss(runner: ModelRunner, exits: ExitHeads, classifier_weight: float) -> Objective:
    """The objective of `train`: Σ_l KL(p_L ‖ p_l) over every position of a batch of windows [B, T+1],
    plus `classifier_weight` times the classifiers' binary cross-entropy."""

    def loss(model: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
        states, final = layer_states(runner, exits, windows[:, :-1])
        target_logp = final.float().log_softmax(dim=-1)  # [B, T, V]
        final_choice = final.argmax(dim=-1)  # [B, T]
        total = torch.zeros((), device=windows.device)
        for layer, hidden in zip(exits.layers, states, strict=True):
            module = exits.exit(layer)
            state = module.state(hidden)  # [B, T, H]
            logp = F.linear(state, exits.lm_head).float().log_softmax(dim=-1)  # [B, T, V]
            total = total + F.kl_div(
                logp.flatten(0, 1), target_logp.flatten(0, 1), log_target=True, reduction="batchmean"
            )
            if module.classifier is not None:
                agrees = (logp.argmax(dim=-1) == final_choice).float()  # [B, T]
                score = module.classifier(state.detach()).squeeze(-1).float()  # [B, T] logits
                total = total + classifier_weight * balanced_bce(score, agrees)
        return total

    return loss


def balanced_bce(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of logits `scores` against 0/1 `labels` (same shape), each class's mean
    weighing the same whatever its frequency (the mean of the classes present), so that the rarer
    class is not traded away for the majority's accuracy: the class-balanced loss."""
    losses = F.binary_cross_entropy_with_logits(scores, labels, reduction="none")
    positive = labels > 0.5
    class_means = [losses[members].mean() for members in (positive, ~positive) if members.any()]
    return torch.stack(class_means).mean()


def heldout_windows(tokens: torch.Tensor, count: int, seq_len: int) -> torch.Tensor:
    """Up to `count` consecutive, non-overlapping windows of `seq_len` tokens of `tokens` [M]: [E, T] int64."""
    available = len(tokens) // seq_len
    if available < 1:
        raise JobError(f"the held-out split holds {len(tokens)} tokens, fewer than one window of {seq_len}")
    return tokens[: min(count, available) * seq_len].view(-1, seq_len).long()


@torch.no_grad()
def layer_agreement(
    exits: ExitHeads, runner: ModelRunner, windows: torch.Tensor, batch_size: int
) -> list[dict[str, Any]]:
    """Per exit: the share of positions of `windows` [E, T] whose argmax equals the final layer's, the
    mean KL(p_L ‖ p_l), and (with a classifier) the share of its yes/no calls that are right, its
    balanced accuracy (the mean of its recall on agreeing and on disagreeing positions) and the
    accuracy of always answering "no" (1 − agreement)."""
    agree = torch.zeros(len(exits.layers))
    kl = torch.zeros(len(exits.layers))
    called = torch.zeros(len(exits.layers))
    said_yes_right = torch.zeros(len(exits.layers))  # agreeing positions the classifier called agreeing
    for chunk in windows.split(batch_size):
        states, final = layer_states(runner, exits, chunk.to(runner.device))
        target_logp = final.float().log_softmax(dim=-1)
        for i, (layer, hidden) in enumerate(zip(exits.layers, states, strict=True)):
            module = exits.exit(layer)
            state = module.state(hidden)
            logp = F.linear(state, exits.lm_head).float().log_softmax(dim=-1)
            same = logp.argmax(dim=-1) == final.argmax(dim=-1)  # [b, T]
            agree[i] += same.sum().item()
            kl[i] += (target_logp.exp() * (target_logp - logp)).sum().item()
            if module.classifier is not None:
                says_yes = module.confidence(state) >= 0.5  # [b, T]
                called[i] += (says_yes == same).sum().item()
                said_yes_right[i] += (says_yes & same).sum().item()
    count = windows.numel()
    rows = []
    for i, layer in enumerate(exits.layers):
        row = {"layer": layer, "agreement": round(agree[i].item() / count, 4), "kl": round(kl[i].item() / count, 4)}
        if exits.has_classifier:
            agreeing, disagreeing = agree[i].item(), count - agree[i].item()
            said_no_right = called[i].item() - said_yes_right[i].item()
            balanced = balanced_accuracy(said_yes_right[i].item(), agreeing, said_no_right, disagreeing)
            row["classifier_accuracy"] = round(called[i].item() / count, 4)
            row["classifier_balanced_accuracy"] = round(balanced, 4)
            row["always_no_accuracy"] = round(disagreeing / count, 4)
        rows.append(row)
    return rows


def balanced_accuracy(yes_right: float, yes_total: float, no_right: float, no_total: float) -> float:
    """The mean of a yes/no classifier's recall on each class present: `yes_right` of `yes_total`
    positives called yes, `no_right` of `no_total` negatives called no. Always answering the majority
    scores 0.5, however rare the minority.

    >>> balanced_accuracy(1, 4, 90, 96), balanced_accuracy(0, 0, 3, 4)
    (0.59375, 0.75)
    """
    recalls = [right / total for right, total in ((yes_right, yes_total), (no_right, no_total)) if total]
    return sum(recalls) / len(recalls)


def print_agreement(report: list[dict[str, Any]]) -> None:
    lines = ["layer  agreement  logit lens  KL      classifier  balanced  always no"]
    for r in report:
        lens = r["logit_lens_agreement"]
        line = f"{r['layer']:>5}  {r['agreement']:>9.3f}  {lens:>10.3f}  {r['kl']:<6.3f}"
        if "classifier_accuracy" in r:
            line += (
                f"  {r['classifier_accuracy']:>10.3f}  {r['classifier_balanced_accuracy']:>8.3f}"
                f"  {r['always_no_accuracy']:>9.3f}"
            )
        lines.append(line)
    print("\n".join(lines))
