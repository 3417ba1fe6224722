"""Configs of the jobs that start a model from the target's weights and train it on data the target
produced: a consistency model for Jacobi decoding (`train cllm`) and a conditional masked LM for
Mask-Predict (`train cmlm`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from jobs.train.config import SAVE_DTYPES, CorpusConfig, ExportingLoopConfig, OptimConfig, check_loop
from pipeline.errors import JobError
from strategies.config_option import option

CLLM_AR_LABELS = ("target", "corpus")


@dataclass
class CLLMDataConfig:
    prompts: int = option(
        512,
        "Training prompts: windows of the corpus' training split, each decoded block by block with Jacobi by the "
        "target. Their trajectories are collected once and cached in the checkpoint directory.",
    )
    prompt_tokens: int = option(64, "Tokens of each prompt window.")
    block_size: int = option(16, "Jacobi block n: tokens guessed and refined together (the CLLM paper: 16).")
    blocks: int = option(
        8,
        "Blocks decoded after each prompt (the length cap: blocks * block_size tokens); a row also stops after "
        "the block whose fixed point holds EOS.",
    )
    batch_size: int = option(32, "Prompts decoded together while collecting trajectories.")


@dataclass
class CLLMLossConfig:
    ar_weight: float = option(
        10.0,
        "Weight of the autoregressive loss (cross-entropy on the fixed point, the target's greedy tokens) "
        "against the global consistency loss (weight 1). Keeps the model from collapsing to repeats.",
    )
    label_smoothing: float = option(0.1, "Label smoothing of the autoregressive loss, in [0, 1).")
    ar_labels: str = option(
        "target",
        f"One of {CLLM_AR_LABELS}: what the autoregressive loss learns at each block. target: the fixed point, the "
        "target's greedy tokens (the paper's default). corpus: the corpus text that followed the prompt, on the "
        "corpus' own context (the paper's use_gt_labels). Either reuses one collection of trajectories.",
    )


@dataclass
class CLLMEvalConfig:
    prompts: int = option(
        64,
        "Held-out prompts (windows of the held-out split, data.prompt_tokens each) whose Jacobi trajectories "
        "give the statistics of the target before and of the CLLM after training. 0: skip.",
    )
    heldout_tokens: int = option(
        200_000, "Held-out corpus tokens scored for the loss (nats/token) of the target and of the CLLM. 0: skip."
    )
    seq_len: int = option(1024, "Window length of the held-out loss.")
    batch_size: int = option(4, "Windows per forward pass of the held-out loss.")


@dataclass
class FineTuneTrainConfig(ExportingLoopConfig):
    """The train section of a job that collects data with the target, then trains on it (cllm, cmlm)."""

    threads: int = option(0, "torch intra-op threads (collection and training). 0: torch's default (all cores).")
    checkpoint_dir: str = option(
        "",
        "Where the resumable state and the collected data go; re-running the same command resumes from them. "
        "Empty: <output_dir>/checkpoint.",
    )


@dataclass
class CLLMTrainConfig(FineTuneTrainConfig):
    batch_size: int = option(8, "Trajectory states per step: one random non-final state of a random block each.")


@dataclass
class CLLMJobConfig:
    target: str = option(MISSING, "Target model directory: its Jacobi trajectories are the data, a copy is trained.")
    output_dir: str = option(MISSING, "Directory receiving the consistency model (and the tokenizer).")
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    data: CLLMDataConfig = field(default_factory=CLLMDataConfig)
    loss: CLLMLossConfig = field(default_factory=CLLMLossConfig)
    eval: CLLMEvalConfig = field(default_factory=CLLMEvalConfig)
    train: CLLMTrainConfig = field(default_factory=CLLMTrainConfig)
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=2e-5, min_lr_ratio=0.0, warmup_steps=20, weight_decay=0.0)
    )


def check_cllm(config: CLLMJobConfig, context: int) -> None:
    """Value checks of `train cllm` against its target's `context`, before any trajectory is collected."""
    data = config.data
    counts = {"prompts": data.prompts, "prompt_tokens": data.prompt_tokens, "blocks": data.blocks}
    for key, value in {**counts, "batch_size": data.batch_size}.items():
        if value < 1:
            raise JobError(f"data.{key}={value}: use a value >= 1")
    if data.block_size < 2:
        raise JobError(f"data.block_size={data.block_size}: use at least 2 (one token is plain decoding)")
    length = data.prompt_tokens + data.blocks * data.block_size
    if length > context:
        raise JobError(
            f"data.prompt_tokens + data.blocks * data.block_size = {length} exceeds the target's context of "
            f"{context} tokens"
        )
    if config.loss.ar_weight < 0:
        raise JobError(f"loss.ar_weight={config.loss.ar_weight}: use a value >= 0")
    if not 0.0 <= config.loss.label_smoothing < 1.0:
        raise JobError(f"loss.label_smoothing={config.loss.label_smoothing}: use a value in [0, 1)")
    if config.loss.ar_labels not in CLLM_AR_LABELS:
        raise JobError(f"loss.ar_labels={config.loss.ar_labels!r}: use one of {CLLM_AR_LABELS}")
    if min(config.eval.prompts, config.eval.heldout_tokens) < 0 or min(config.eval.seq_len, config.eval.batch_size) < 1:
        raise JobError("eval.prompts and eval.heldout_tokens must be >= 0, eval.seq_len and eval.batch_size >= 1")
    if config.eval.seq_len > context:
        raise JobError(f"eval.seq_len={config.eval.seq_len} exceeds the target's context of {context} tokens")
    check_loop(config.train)


@dataclass
class CMLMShape:
    layers: int = option(
        3,
        "Transformer blocks of the CMLM, initialised from the target's first ones (with its embeddings and final "
        "norm); fewer than the target's make each refinement pass cheaper.",
    )
    max_length: int = option(64, "L: the longest block the CMLM fills, and its number of length tokens <len_1…L>.")


@dataclass
class CMLMDataConfig:
    prompts: int = option(
        2000,
        "Distillation prompts: windows of the corpus' training split, each continued greedily by the target. "
        "The continuations are collected once and cached in the checkpoint directory.",
    )
    prompt_tokens: int = option(192, "Tokens of each prompt window (the longest context an example sees).")
    min_context: int = option(16, "Shortest context of an example; each takes a uniform length up to prompt_tokens.")
    continuation: int = option(
        128,
        "Greedy tokens the target adds to each prompt (stopping early at EOS). An example is the L tokens after a "
        "random split point of the continuation, so one continuation gives many blocks.",
    )
    batch_size: int = option(32, "Prompts continued together while collecting.")
    short_block_share: float = option(
        0.5,
        "Share of examples whose block is cut to a uniform 1…length tokens (a drafter fills short blocks); the "
        "length token still names the block's true length.",
    )


@dataclass
class CMLMEvalConfig:
    prompts: int = option(
        48,
        "Held-out prompts (windows of the held-out split) decoded with Mask-Predict before and after training: "
        "token agreement with the target's greedy continuation. 0: skip.",
    )
    iterations: list[int] = option([1, 4, 10], "Mask-Predict passes T measured on the held-out prompts.")


@dataclass
class CMLMTrainConfig(FineTuneTrainConfig):
    steps: int = option(1500, "Optimizer steps.")
    batch_size: int = option(16, "Examples per step: (context, block) pairs, the block uniformly masked.")
    save_dtype: str = option("float16", f"One of {SAVE_DTYPES}: dtype of the exported model.safetensors.")
    length_weight: float = option(0.1, "Weight of the length cross-entropy beside the masked tokens' cross-entropy.")


@dataclass
class CMLMJobConfig:
    target: str = option(MISSING, "Target model directory: its greedy continuations are the CMLM's outputs.")
    output_dir: str = option(MISSING, "Directory receiving the CMLM (model, tokenizer with its tokens, cmlm.json).")
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    shape: CMLMShape = field(default_factory=CMLMShape)
    data: CMLMDataConfig = field(default_factory=CMLMDataConfig)
    eval: CMLMEvalConfig = field(default_factory=CMLMEvalConfig)
    train: CMLMTrainConfig = field(default_factory=CMLMTrainConfig)
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-3, min_lr_ratio=0.1, warmup_steps=50, weight_decay=0.0)
    )


def check_cmlm(config: CMLMJobConfig, layers: int, context: int) -> None:
    """Value checks of `train cmlm` against its target's `layers` and `context`, before anything is collected."""
    shape, data = config.shape, config.data
    if not 1 <= shape.layers <= layers:
        raise JobError(f"shape.layers={shape.layers}: use 1 to the target's {layers}")
    if shape.max_length < 1:
        raise JobError(f"shape.max_length={shape.max_length}: use a value >= 1")
    for key in ("prompts", "prompt_tokens", "min_context", "continuation", "batch_size"):
        if getattr(data, key) < 1:
            raise JobError(f"data.{key}={getattr(data, key)}: use a value >= 1")
    if data.min_context > data.prompt_tokens:
        raise JobError(f"data.min_context={data.min_context} exceeds data.prompt_tokens={data.prompt_tokens}")
    if data.continuation < shape.max_length:
        raise JobError(f"data.continuation={data.continuation} is shorter than one block (shape.max_length)")
    if data.prompt_tokens + data.continuation + 2 > context:
        raise JobError(
            f"data.prompt_tokens + data.continuation + 2 = {data.prompt_tokens + data.continuation + 2} exceeds the "
            f"target's context of {context} tokens"
        )
    if not 0.0 <= data.short_block_share <= 1.0:
        raise JobError(f"data.short_block_share={data.short_block_share}: use a value in [0, 1]")
    if config.eval.prompts < 0 or any(t < 1 for t in config.eval.iterations):
        raise JobError("eval.prompts must be >= 0 and every eval.iterations value >= 1")
    check_loop(config.train)
    if config.train.length_weight < 0:
        raise JobError(f"train.length_weight={config.train.length_weight}: use a value >= 0")
