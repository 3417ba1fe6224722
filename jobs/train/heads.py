"""`train heads` and `train heads-eval`: Medusa-style draft heads on the frozen target, by self-distillation.

The heads (`strategies.artifacts.heads`) read the target's last hidden state h_t and guess tokens t+2…t+1+K.
What decoding rewards is guessing what the target will say, not what the corpus says, so the labels
are the target's own greedy continuations: prompt windows of the corpus' training split, each
continued by the target (`AutoregressiveStrategy`, batched, much faster than transformers' `generate`
on CPU). Only generated tokens are labels. The sequences are generated once and cached in the
checkpoint directory beside the training state, under the same config fingerprint, so a resumed run
does not generate them again.

The target is frozen, so its hidden states are data: they are computed once per run, in float32
outside the loop's autocast (what decoding reads on CPU), and a training step only runs the heads.
The loss is Σ_i loss_decay^i · CE(head_i(h_t), x_{t+2+i}), as in Medusa.

The accuracy reported (and recorded in heads.json) is Medusa's: per head, the share of held-out
positions whose label (the target's greedy token) is the head's top-1 guess, or among its top 5.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from jobs.train.config_heads import EagleJobConfig, HeadsEvalJobConfig, HeadsJobConfig, check_heads, check_sequences
from jobs.train.corpus import Corpus, Document, load_corpus
from jobs.train.draft_vocab import trained_head, use_draft_vocab, write_draft_vocab
from jobs.train.loop import Objective, TrainSummary, single_phase, train, use_device, versions
from jobs.train.model import count_parameters, load_float32
from jobs.train.on_target import TargetRun, start_on_target
from jobs.train.samplers import SequenceSampler
from jobs.train.sequences import cached_sequences, continue_greedily, data_fingerprint, draw_prompts
from jobs.train.tokenizer import encode_documents, load_tokenizer
from pipeline.errors import JobError
from strategies.artifacts.configs import HeadsConfig
from strategies.artifacts.eagle import EagleHead
from strategies.artifacts.heads import DraftHeads, load_heads
from workers.common.model_files import weights_sha256

IGNORE = -100  # label of a position whose token t+2+i is not a generated one (cross_entropy's ignore_index)
TOP_K = 5  # Medusa reports top-1 and top-5 accuracy
DATA_SUBDIR = "sequences"  # the generated sequences, a checkpoint of their own inside the checkpoint directory


def train_heads(config: HeadsJobConfig) -> Path:
    """Train the heads described by `config` on its frozen target; returns the heads' directory."""
    on_target, corpus = start_on_sequences(config, check_heads)
    if config.draft_vocab_only:
        return write_heads_draft_vocab(config, on_target, corpus)
    target, tokenizer = on_target.target, on_target.tokenizer
    run = training_sequences(config, on_target, corpus)
    heads = new_heads(config, target)
    data, num_heads = config.data, config.heads.num_heads
    hidden = hidden_windows(target, run.sequences, data.prompt_tokens, num_heads, data.batch_size)  # [N, W, H]
    labels = head_labels(run.sequences, data.prompt_tokens, num_heads).to(on_target.device)  # [N, K, W]
    loss = heads_loss(hidden, labels, config.loss_decay)
    summary = train_on_sequences("heads", config, run, heads, loss, data.continuation_tokens)
    del hidden, labels, loss  # the training set's states: free them before the held-out ones
    vocab = use_draft_vocab("heads", heads, config.draft_vocab, tokenizer, corpus)
    accuracy = heldout_accuracy(heads, target, tokenizer, corpus.heldout, eval_config(config))
    measured = {"heldout_accuracy": accuracy, "draft_vocab": vocab.record}
    out = save_trained("heads", config, run, heads, summary, measured)
    vocab.save(out)
    return out


def start_on_sequences(
    config: HeadsJobConfig | EagleJobConfig, check: Callable[[Any, int, int], None]
) -> tuple[TargetRun, Corpus]:
    """The start of a job distilled from its frozen target's continuations (heads, EAGLE): the target
    loaded, `config` checked against its context and vocabulary size (`check`), the corpus read."""
    on_target = start_on_target(config, frozen=True)
    target = on_target.target
    check(config, target.config.max_position_embeddings, target.get_output_embeddings().weight.shape[0])
    return on_target, load_corpus(config.corpus)


def write_heads_draft_vocab(config: HeadsJobConfig, on_target: TargetRun, corpus: Corpus) -> Path:
    """`draft_vocab_only`: the draft vocabulary of the heads trained in output_dir, and their held-out accuracy
    with it, written to `heads.json` and `draft_vocab.safetensors`; `heads.safetensors` is left as it is."""
    target, tokenizer, out = on_target.target, on_target.tokenizer, on_target.output_dir
    device = target.lm_head.weight.device
    heads = trained_head(lambda: load_heads(out, torch.float32, device, draft_vocab=False), out, config.target)
    if config.draft_vocab and heads.projections is not None:
        raise JobError(
            f"the heads in output_dir={out} have projections of their own: a draft vocabulary needs shared ones "
            "(draft_vocab=0)"
        )
    if heads.projections is None:
        heads.use_lm_head(target.lm_head.weight)

    def measure() -> dict[str, Any]:
        return {"heldout_accuracy": heldout_accuracy(heads, target, tokenizer, corpus.heldout, eval_config(config))}

    return write_draft_vocab("heads", heads, out, config.draft_vocab, tokenizer, corpus, measure)


@dataclass
class SequencesRun:
    """A job distilled from its frozen target's own greedy continuations (heads, EAGLE)."""

    on_target: TargetRun
    corpus: Corpus
    sequences: torch.Tensor  # [N, P+C] the training sequences: prompt windows and their continuations
    generation_s: float  # what generating the sequences took, in whichever run made them


def train_on_sequences(
    job: str,
    config: HeadsJobConfig,
    run: SequencesRun,
    trained: DraftHeads | EagleHead,
    loss: Objective,
    positions: int,
) -> TrainSummary:
    """Train `trained` on `loss` over batches of the run's sequences, `positions` predictions each, in one phase."""
    data = config.data
    print(
        f"{job}: {count_parameters(trained) / 1e6:.2f} M parameters; {len(run.sequences)} sequences of "
        f"{data.prompt_tokens} prompt + {data.continuation_tokens} generated tokens from {run.corpus.source}; "
        f"checkpoints in {run.on_target.checkpoint_dir}"
    )
    return train(
        trained,
        loss,
        SequenceSampler(len(run.sequences), config.train.seed),
        single_phase(config.train, positions),
        config.optim,
        run.on_target.checkpoint_dir,
        run.on_target.fingerprint,
    )


def save_trained(
    job: str,
    config: HeadsJobConfig,
    run: SequencesRun,
    trained: DraftHeads | EagleHead,
    summary: TrainSummary,
    measured: dict[str, Any],
) -> Path:
    """Save `trained` with its training record: its data and what generating it took, the loop's summary,
    then `measured` (the job's own entries: its held-out measure and any other); returns its directory."""
    trained.config.training = {
        "job": job,
        "config": run.on_target.fingerprint,
        "corpus": run.corpus.source,
        "sequences": len(run.sequences),
        "generated_tokens": len(run.sequences) * config.data.continuation_tokens,
        "generation_wall_s": run.generation_s,
        "parameters": count_parameters(trained),
        **asdict(summary),
        "heldout_sequences": config.data.eval_sequences,
        **measured,
        **versions(),
    }
    out = run.on_target.output_dir
    trained.save(out)
    print(
        f"{job}: {summary.steps} steps, {summary.tokens_seen / 1e6:.2f} M tokens in {summary.wall_s:.0f} s "
        f"(+ {run.generation_s:.0f} s generating); training loss {summary.train_loss:.3f}; saved to {out}"
    )
    return out


def evaluate_heads(config: HeadsEvalJobConfig) -> list[dict[str, Any]]:
    """`train heads-eval`: per-head top-1/top-5 accuracy of saved heads on held-out text; print, maybe save."""
    device = use_device(config.device, config.threads)
    try:
        heads = load_heads(Path(config.heads), torch.float32, device)
    except (OSError, ValueError) as exc:
        raise JobError(f"heads={config.heads!r}: {exc}") from None
    target_dir = config.target or heads.config.target_path
    target, tokenizer = load_float32(target_dir, device, frozen=True), load_tokenizer(target_dir)
    if weights_sha256(Path(target_dir)) != heads.config.target_weights_sha256:
        raise JobError(f"heads {config.heads} were trained for another target than target={target_dir!r}")
    counts = {"sequences": config.sequences, "batch_size": config.batch_size}
    check_sequences("", counts, config.prompt_tokens, config.continuation_tokens, target.config.max_position_embeddings)
    if config.prompt_tokens <= heads.num_heads:
        raise JobError(f"prompt_tokens={config.prompt_tokens}: use more than the heads' {heads.num_heads} tokens")
    if heads.config.shared_lm_head:
        heads.use_lm_head(target.lm_head.weight)
    accuracy = heldout_accuracy(heads, target, tokenizer, load_corpus(config.corpus).heldout, config)
    if config.report:
        Path(config.report).parent.mkdir(parents=True, exist_ok=True)
        Path(config.report).write_text(json.dumps(accuracy, indent=2) + "\n")
    return accuracy


def eval_config(config: HeadsJobConfig) -> HeadsEvalJobConfig:
    """The held-out measurement a training run ends with, as `train heads-eval` would run it again."""
    data = config.data
    return HeadsEvalJobConfig(
        heads=config.output_dir,
        target=config.target,
        corpus=config.corpus,
        sequences=data.eval_sequences,
        prompt_tokens=data.prompt_tokens,
        continuation_tokens=data.continuation_tokens,
        batch_size=data.batch_size,
        seed=config.train.seed,
    )


def heldout_accuracy(
    heads: DraftHeads,
    target: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    documents: list[Document],
    config: HeadsEvalJobConfig,
) -> list[dict[str, Any]]:
    """Per-head top-1/top-5 accuracy on prompts of `documents` continued greedily by the target; printed."""
    tokens = encode_documents(tokenizer, documents)  # [M]
    prompts = draw_prompts(tokens, config.sequences, config.prompt_tokens, config.seed)  # [E, P]
    sequences = continue_greedily(target, prompts, config.continuation_tokens, config.batch_size, "held-out")
    accuracy = heads_accuracy(heads, target, sequences, config.prompt_tokens, config.batch_size)
    lines = ["head  predicts  top-1   top-5"]
    lines += [f"{a['head']:>4}  {a['predicts']:>8}  {a['top1']:.3f}   {a['top5']:.3f}" for a in accuracy]
    print("\n".join(lines))
    return accuracy


def training_sequences(config: HeadsJobConfig, on_target: TargetRun, corpus: Corpus) -> SequencesRun:
    """The training sequences (cached, or generated now from the corpus' training split)."""
    data = config.data

    def generate() -> torch.Tensor:
        tokens = encode_documents(on_target.tokenizer, corpus.train)  # [M]
        prompts = draw_prompts(tokens, data.sequences, data.prompt_tokens, config.train.seed)  # [N, P]
        return continue_greedily(on_target.target, prompts, data.continuation_tokens, data.batch_size, "generate")

    data_key = data_fingerprint(on_target.fingerprint, ignore=("data.eval_sequences",))
    sequences, generation_s = cached_sequences(on_target.checkpoint_dir / DATA_SUBDIR, data_key, generate)
    return SequencesRun(on_target, corpus, sequences, generation_s)


def new_heads(config: HeadsJobConfig, target: torch.nn.Module) -> DraftHeads:
    """Untrained heads for `target`, deterministic for train.seed, reading (or starting from) its LM head."""
    lm_head = target.lm_head.weight  # [V, H]
    torch.manual_seed(config.train.seed)
    heads = DraftHeads(
        HeadsConfig(
            num_heads=config.heads.num_heads,
            hidden_size=lm_head.shape[1],
            vocab_size=lm_head.shape[0],
            num_layers=config.heads.num_layers,
            shared_lm_head=config.heads.shared_lm_head,
            target_path=config.target,
            target_weights_sha256=weights_sha256(Path(config.target)),
        )
    )
    if config.heads.shared_lm_head:
        heads.use_lm_head(lm_head)
    else:
        heads.start_projections(lm_head)
    return heads


def first_position(prompt_tokens: int, num_heads: int) -> int:
    """The first position t whose state has a generated label for some head: head K-1 at t = P-1-K."""
    return prompt_tokens - 1 - num_heads


@torch.no_grad()
def hidden_windows(
    target: torch.nn.Module, sequences: torch.Tensor, prompt_tokens: int, num_heads: int, batch_size: int
) -> torch.Tensor:
    """The target's last hidden states (after its final norm) at positions P-1-K … L-3: [N, W, H], W = C+K-1.

    Those are the positions where some head's label t+2+i is a generated token. Float32, on the
    target's device.
    """
    first = first_position(prompt_tokens, num_heads)
    device = target.lm_head.weight.device
    chunks = []
    for chunk in sequences.split(batch_size):
        states = target.model(input_ids=chunk.long().to(device)).last_hidden_state.float()  # [b, L, H]
        chunks.append(states[:, first : chunk.shape[1] - 2])  # [b, W, H]
    return torch.cat(chunks)


def head_labels(sequences: torch.Tensor, prompt_tokens: int, num_heads: int) -> torch.Tensor:
    """Head i's label at each position t of `hidden_windows`: token t+2+i when generated, else IGNORE: [N, K, W]."""
    n, length = sequences.shape
    positions = torch.arange(first_position(prompt_tokens, num_heads), length - 2)  # [W]
    labels = torch.full((n, num_heads, len(positions)), IGNORE, dtype=torch.long)  # [N, K, W]
    for i in range(num_heads):
        wanted = positions + 2 + i  # [W]
        generated = (wanted >= prompt_tokens) & (wanted < length)  # [W]
        labels[:, i, generated] = sequences[:, wanted[generated]].long()
    return labels


def heads_loss(hidden: torch.Tensor, labels: torch.Tensor, decay: float) -> Objective:
    """The objective of `train`: Σ_i decay^i · CE(head i, its labels), for a batch of sequence indices [B].

    `hidden` [N, W, H] and `labels` [N, K, W] are the whole data set, on the training device.
    """
    weights = decay ** torch.arange(labels.shape[1], dtype=torch.float32, device=labels.device)  # [K]

    def loss(heads: torch.nn.Module, indices: torch.Tensor) -> torch.Tensor:
        logits = heads(hidden[indices])  # [K, B, W, V]
        targets = labels[indices]  # [B, K, W]
        per_head = torch.stack(
            [
                F.cross_entropy(head.float().flatten(0, 1), targets[:, i].flatten(), ignore_index=IGNORE)
                for i, head in enumerate(logits)
            ]
        )  # [K]
        return (weights * per_head).sum()

    return loss


@torch.no_grad()
def heads_accuracy(
    heads: DraftHeads, target: torch.nn.Module, sequences: torch.Tensor, prompt_tokens: int, batch_size: int
) -> list[dict[str, Any]]:
    """Per head: the share of generated labels in `sequences` [N, L] that are its top-1 guess, and its top-5,
    among the tokens it drafts (its draft vocabulary's, where it has one)."""
    k = heads.num_heads
    hidden = hidden_windows(target, sequences, prompt_tokens, k, batch_size)  # [N, W, H]
    labels = head_labels(sequences, prompt_tokens, k).transpose(0, 1).to(hidden.device)  # [K, N, W]
    top1 = torch.zeros(k, device=hidden.device)
    top5 = torch.zeros(k, device=hidden.device)
    for rows in torch.arange(len(sequences), device=hidden.device).split(batch_size):
        guesses = heads.to_target(heads.draft_logits(hidden[rows]).topk(TOP_K, dim=-1).indices)  # [K, b, W, 5]
        hits = guesses == labels[:, rows, :, None]  # [K, b, W, 5]; IGNORE never matches a token
        top1 += hits[..., 0].sum((1, 2))
        top5 += hits.any(-1).sum((1, 2))
    count = (labels != IGNORE).sum((1, 2))  # [K]
    return [
        {"head": i, "predicts": f"t+{i + 2}", "top1": round(a.item(), 4), "top5": round(b.item(), 4)}
        for i, (a, b) in enumerate(zip(top1 / count, top5 / count, strict=True))
    ]
