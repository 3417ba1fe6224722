"""Configs of the jobs that train small modules on a frozen target: Medusa heads (`train heads`,
`train heads-eval`), an EAGLE head (`train eagle`) and exit heads (`train exits`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from jobs.train.config import PRECISIONS, CorpusConfig, LoopConfig, OptimConfig, StepsConfig, check_loop
from pipeline.errors import JobError
from strategies.config_option import option


@dataclass
class HeadsShape:
    num_heads: int = option(4, "Heads K; head i (0-based) guesses the token 2+i positions after the state it reads.")
    num_layers: int = option(1, "ResBlocks per head (h + SiLU(W h + b), starting as the identity).")
    shared_lm_head: bool = option(
        True,
        "End every head in the target's frozen LM head (a folder of about K * H * H floats). "
        "false: each head gets its own projection [V, H], started from the LM head (K * V * H more floats).",
    )


@dataclass
class HeadsDataConfig:
    sequences: int = option(
        2048,
        "Training sequences: prompt windows of the corpus' training split, each continued greedily by the "
        "target. Generated once and cached in the checkpoint directory.",
    )
    prompt_tokens: int = option(
        64, "Tokens of each prompt window; must exceed heads.num_heads so every head sees every label."
    )
    continuation_tokens: int = option(
        128,
        "Greedy tokens the target generates after each prompt: the labels (the heads learn only what the "
        "target says, never the corpus' own text). Tokens seen per step = train.batch_size * this.",
    )
    batch_size: int = option(64, "Rows the target decodes together while generating.")
    eval_sequences: int = option(
        256, "Held-out sequences (prompts of the held-out split, the target's continuations) of the accuracy."
    )


@dataclass
class HeadsTrainConfig(LoopConfig):
    steps: int = option(1200, "Optimizer steps.")
    batch_size: int = option(8, "Sequences per step (each gives data.continuation_tokens labels to every head).")
    seed: int = option(0, "Seed of prompt sampling, head initialization and sequence order.")
    precision: str = option(
        "float32",
        f"One of {PRECISIONS}: autocast dtype of forward/backward. bfloat16 only pays on GPUs (or CPUs with "
        "bfloat16 matmuls): on AVX2 it is many times slower.",
    )
    threads: int = option(0, "torch intra-op threads (generation and training). 0: torch's default (all cores).")
    checkpoint_dir: str = option(
        "",
        "Where the resumable state and the generated sequences go; re-running the same command resumes from "
        "them. Empty: <output_dir>/checkpoint.",
    )


@dataclass
class HeadsJobConfig:
    target: str = option(MISSING, "Target model directory: frozen; its last hidden state is what the heads read.")
    output_dir: str = option(MISSING, "Directory receiving heads.json and heads.safetensors.")
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    heads: HeadsShape = field(default_factory=HeadsShape)
    data: HeadsDataConfig = field(default_factory=HeadsDataConfig)
    loss_decay: float = option(
        0.8, "Head i's cross-entropy weighs loss_decay**i: later heads guess further ahead and are less reliable."
    )
    train: HeadsTrainConfig = field(default_factory=HeadsTrainConfig)
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-3, warmup_steps=50, weight_decay=0.0, grad_clip=1.0)
    )
    draft_vocab: int = option(
        0,
        "Draft vocabulary: the N tokens most frequent in the corpus' training split, the only ones shared heads "
        "draft (scoring N rows of the LM head, not all; the target still verifies with all). 0: the whole vocabulary.",
    )
    draft_vocab_only: bool = option(
        False,
        "Only count the corpus and write the draft vocabulary (draft_vocab) into the heads already trained in "
        "output_dir, then measure their held-out accuracy again: their weights are not touched.",
    )


@dataclass
class HeadsEvalJobConfig:
    heads: str = option(MISSING, "Heads directory written by `train heads`.")
    target: str = option("", "Target model directory. Empty: the target_path recorded in the heads.")
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    sequences: int = option(
        256, "Held-out sequences: prompt windows of the held-out split, each continued greedily by the target."
    )
    prompt_tokens: int = option(64, "Tokens of each prompt window.")
    continuation_tokens: int = option(128, "Greedy tokens the target generates after each prompt: the labels.")
    batch_size: int = option(64, "Rows the target decodes together while generating.")
    seed: int = option(0, "Seed of the held-out prompt windows.")
    device: str = option("auto", "auto: cuda when available, else cpu. Or any torch device string.")
    threads: int = option(0, "torch intra-op threads. 0: torch's default (all cores).")
    report: str = option("", "Also write the accuracies as JSON to this path.")


def check_sequences(
    prefix: str, counts: dict[str, int], prompt_tokens: int, continuation_tokens: int, context: int
) -> None:
    """Sizes of generated sequences: `counts` ({key: value}) >= 1, prompt + continuation within `context`."""
    for key, value in {**counts, "prompt_tokens": prompt_tokens, "continuation_tokens": continuation_tokens}.items():
        if value < 1:
            raise JobError(f"{prefix}{key}={value}: use a value >= 1")
    if prompt_tokens + continuation_tokens > context:
        raise JobError(
            f"{prefix}prompt_tokens + {prefix}continuation_tokens = {prompt_tokens + continuation_tokens} "
            f"exceeds the target's context of {context} tokens"
        )


def check_draft_vocab(size: int, vocab_size: int) -> None:
    """A JobError unless `draft_vocab` is 0 (the whole vocabulary) or at most the target's `vocab_size`."""
    if not 0 <= size <= vocab_size:
        raise JobError(f"draft_vocab={size}: use 0 (the whole vocabulary) or at most the target's {vocab_size} tokens")


def check_heads(config: HeadsJobConfig, context: int, vocab_size: int) -> None:
    """Value checks of `train heads` against its target's `context` and `vocab_size`, before any sequence is
    generated."""
    check_draft_vocab(config.draft_vocab, vocab_size)
    if config.draft_vocab and not config.heads.shared_lm_head:
        raise JobError(
            f"draft_vocab={config.draft_vocab} needs heads that share the target's LM head: set "
            "heads.shared_lm_head=true, or draft_vocab=0"
        )
    data = config.data
    counts = {"sequences": data.sequences, "batch_size": data.batch_size, "eval_sequences": data.eval_sequences}
    check_sequences("data.", counts, data.prompt_tokens, data.continuation_tokens, context)
    if min(config.heads.num_heads, config.heads.num_layers) < 1:
        raise JobError("heads.num_heads and heads.num_layers must be >= 1")
    if data.prompt_tokens <= config.heads.num_heads:
        raise JobError(f"data.prompt_tokens={data.prompt_tokens}: use more than heads.num_heads tokens")
    if not 0.0 < config.loss_decay <= 1.0:
        raise JobError(f"loss_decay={config.loss_decay}: use a value in (0, 1]")
    check_loop(config.train)


@dataclass
class EagleEvalConfig:
    depth: int = option(5, "Draft depth whose acceptance is measured on held-out prompts (EAGLE chain and tree).")
    new_tokens: int = option(64, "Tokens the measured strategies decode after each held-out prompt.")


@dataclass
class EagleJobConfig:
    target: str = option(MISSING, "Target model directory: frozen; its features and LM head are what the head uses.")
    output_dir: str = option(MISSING, "Directory receiving eagle.json and eagle.safetensors.")
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    data: HeadsDataConfig = field(default_factory=HeadsDataConfig)
    noise: float = option(
        0.1, "Half-width a of the uniform noise U(-a, a) added to the input features in training (EAGLE's 0.1)."
    )
    ce_weight: float = option(
        0.1, "Weight of the token cross-entropy (against the target's distribution) beside the feature regression."
    )
    train: HeadsTrainConfig = field(default_factory=HeadsTrainConfig)
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-3, warmup_steps=50, weight_decay=0.0, grad_clip=1.0)
    )
    eval: EagleEvalConfig = field(default_factory=EagleEvalConfig)
    draft_vocab: int = option(
        2048,
        "Draft vocabulary: the N tokens most frequent in the corpus' training split, the only ones the head drafts "
        "(scoring N rows of the LM head, not all; the target still verifies with all). 0: the whole vocabulary.",
    )
    draft_vocab_only: bool = option(
        False,
        "Only count the corpus and write the draft vocabulary (draft_vocab) into the head already trained in "
        "output_dir, then measure its held-out acceptance again: its weights are not touched.",
    )


def check_eagle(config: EagleJobConfig, context: int, vocab_size: int) -> None:
    """Value checks of `train eagle` against its target's `context` and `vocab_size`, before any sequence is
    generated."""
    check_draft_vocab(config.draft_vocab, vocab_size)
    data = config.data
    counts = {"sequences": data.sequences, "batch_size": data.batch_size, "eval_sequences": data.eval_sequences}
    check_sequences("data.", counts, data.prompt_tokens, data.continuation_tokens, context)
    if config.noise < 0 or config.ce_weight < 0:
        raise JobError(f"noise={config.noise}, ce_weight={config.ce_weight}: use values >= 0")
    if min(config.eval.depth, config.eval.new_tokens) < 1:
        raise JobError("eval.depth and eval.new_tokens must be >= 1")
    if data.prompt_tokens + config.eval.new_tokens > context:
        raise JobError(f"data.prompt_tokens + eval.new_tokens exceeds the target's context of {context} tokens")
    check_loop(config.train)


@dataclass
class ExitsShape:
    layers: list[int] = option([], "Exit after these many layers, each in 1..L-1. Empty: every layer but the last.")
    adapter_rank: int = option(
        16, "Rank of each exit's adapter z + U(D z) after its norm (U starts at 0: the logit lens). 0: norm only."
    )
    classifier: bool = option(
        True, "Also train CALM's confidence classifier per exit: P(this exit's argmax equals the final layer's)."
    )


@dataclass
class ExitsWindowsConfig(StepsConfig):
    """The corpus windows the exits learn on."""

    seq_len: int = option(128, "Tokens per window; each is a label: the target's final next-token distribution there.")


@dataclass
class ExitsTrainConfig(LoopConfig, ExitsWindowsConfig):
    steps: int = option(300, "Optimizer steps.")
    batch_size: int = option(8, "Windows of the corpus per step.")
    seed: int = option(0, "Seed of window order and initialization.")
    precision: str = option(
        "float32", f"One of {PRECISIONS}: autocast dtype of the exits' forward/backward (bfloat16 only pays on GPUs)."
    )
    checkpoint_every: int = option(50, "Save the resumable training state every this many steps.")
    checkpoint_dir: str = option(
        "", "Where the resumable state goes; re-running the same command resumes. Empty: <output_dir>/checkpoint."
    )


@dataclass
class ExitsJobConfig:
    target: str = option(MISSING, "Target model directory (Llama family): frozen; its layers' states are read.")
    output_dir: str = option(MISSING, "Directory receiving exits.json and exits.safetensors.")
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    exits: ExitsShape = field(default_factory=ExitsShape)
    classifier_weight: float = option(0.1, "Weight of the classifiers' binary cross-entropy beside the exits' KL.")
    eval_windows: int = option(64, "Held-out windows (train.seq_len tokens each) of the per-layer agreement.")
    train: ExitsTrainConfig = field(default_factory=ExitsTrainConfig)
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=2e-3, warmup_steps=20, weight_decay=0.0, grad_clip=1.0)
    )
