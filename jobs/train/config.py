"""Typed configs of the training jobs: one dataclass per job, every field with its help text.

The same config system as `accelgen generate` (`pipeline.config`): YAML plus `key=value` overrides,
checked before any work, and `--help` generated from the field metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from pipeline.errors import JobError
from strategies.config_option import option

PRECISIONS = ("float32", "bfloat16")
CLLM_AR_LABELS = ("target", "corpus")
SAVE_DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class CorpusConfig:
    url: str = option(
        "",
        "Training text: a directory, a glob of text files, or a Parquet file/glob; any fsspec URL. "
        "Empty: the Python standard library sources of the running interpreter.",
    )
    include: list[str] = option(["*.py"], "File-name patterns taken when url is a directory (or empty).")
    exclude_dirs: list[str] = option(
        ["site-packages", "test", "tests", "idle_test", "encodings"],
        "Files under a directory of one of these names are skipped (third-party code, test data, codec tables).",
    )
    text_column: str = option("text", "Column holding the text when the corpus is Parquet.")
    heldout_percent: float = option(
        5.0, "Share of files (by a hash of their relative path) held out of training, for evaluation."
    )
    max_files: int = option(0, "Use only the first N files in path order (quick trial runs). 0: all.")
    storage_options: dict[str, Any] = option({}, "fsspec storage options for the corpus URL.")


@dataclass
class LlamaShape:
    hidden_size: int = option(256, "Width of the residual stream.")
    intermediate_size: int = option(768, "Width of the SwiGLU MLP.")
    num_hidden_layers: int = option(6, "Transformer blocks.")
    num_attention_heads: int = option(4, "Query heads; head_dim = hidden_size / num_attention_heads.")
    num_key_value_heads: int = option(2, "Key/value heads (grouped-query attention when fewer than query heads).")
    max_position_embeddings: int = option(1024, "Context length the model advertises and is trained to reach.")
    rope_theta: float = option(10000.0, "RoPE base frequency.")


@dataclass
class OptimConfig:
    lr: float = option(2e-3, "Peak learning rate of AdamW.")
    min_lr_ratio: float = option(0.1, "The cosine schedule ends at lr * min_lr_ratio.")
    warmup_steps: int = option(100, "Steps of linear warm-up from 0 to lr.")
    weight_decay: float = option(0.1, "AdamW weight decay, applied to matrices (not to norms).")
    beta1: float = option(0.9, "AdamW beta1.")
    beta2: float = option(0.95, "AdamW beta2.")
    grad_clip: float = option(1.0, "Clip the global gradient norm to this value. 0: no clipping.")


@dataclass
class TrainConfig:
    steps: int = option(1000, "Optimizer steps.")
    batch_size: int = option(16, "Windows per step in the first phase; tokens per step = batch_size * seq_len.")
    seq_len: int = option(256, "Window length (tokens) of the first phase: short windows see more tokens per second.")
    final_seq_len: int = option(
        1024,
        "Window length of the last phase, so the model learns every position up to its context; the "
        "batch shrinks to keep tokens per step. Must divide batch_size * seq_len.",
    )
    final_fraction: float = option(0.2, "Share of the steps trained on final_seq_len windows (at the end). 0: none.")
    seed: int = option(0, "Seed of initialization and window order; same seed, corpus and hardware: same weights.")
    precision: str = option(
        "bfloat16", f"One of {PRECISIONS}: autocast dtype of forward/backward (weights stay float32)."
    )
    device: str = option("auto", "auto: cuda when available, else cpu. Or any torch device string.")
    threads: int = option(0, "torch intra-op threads. 0: torch's default (all cores).")
    checkpoint_every: int = option(100, "Save the resumable training state every this many steps.")
    checkpoint_dir: str = option(
        "",
        "Where the resumable state goes; re-running the same command resumes from it. Empty: <output_dir>/checkpoint.",
    )
    save_dtype: str = option("float32", f"One of {SAVE_DTYPES}: dtype of the exported model.safetensors.")


@dataclass
class TokenizerJobConfig:
    output_dir: str = option(MISSING, "Directory receiving tokenizer.json and tokenizer_config.json.")
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    vocab_size: int = option(8192, "Vocabulary size including the special tokens.")
    min_frequency: int = option(2, "A pair must occur at least this often to be merged.")


@dataclass
class LMJobConfig:
    tokenizer: str = option(MISSING, "Tokenizer directory written by `train tokenizer`.")
    output_dir: str = option(MISSING, "Directory receiving the Hugging Face model (and the tokenizer).")
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    model: LlamaShape = field(default_factory=LlamaShape)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class DistillConfig:
    kl_weight: float = option(1.0, "Weight of KL(target || draft) on next-token distributions.")
    ce_weight: float = option(0.0, "Weight of the cross-entropy on the corpus' next tokens.")
    temperature: float = option(1.0, "Both distributions are softened by this temperature; the KL is scaled by T².")


@dataclass
class DraftJobConfig:
    target: str = option(MISSING, "Target model directory (written by `train lm`); its tokenizer is reused.")
    output_dir: str = option(MISSING, "Directory receiving the draft model (and the tokenizer).")
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    model: LlamaShape = field(
        default_factory=lambda: LlamaShape(
            hidden_size=128, intermediate_size=384, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2
        )
    )
    init_layers: list[int] = option(
        [],
        "Target layers (0-based, in order) the draft's layers start from, with the target's embeddings and final "
        "norm: the draft must then have the target's shape but for its layer count. Empty: a random start.",
    )
    distill: DistillConfig = field(default_factory=DistillConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class EvalJobConfig:
    model: str = option(MISSING, "Model directory to evaluate (it holds its tokenizer).")
    draft: str = option("", "Draft model directory: adds its loss, greedy agreement with the model and its speed.")
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    seq_len: int = option(1024, "Window length of the held-out loss.")
    max_tokens: int = option(200_000, "Held-out tokens evaluated at most.")
    batch_size: int = option(4, "Windows per forward pass.")
    decode_tokens: int = option(128, "Tokens generated at batch 1 to measure decode speed. 0: skip.")
    prompt_tokens: int = option(64, "Prompt length (held-out tokens) of the decode-speed measurement.")
    device: str = option("cpu", "Device of the evaluation; decode speed is reported for this device.")
    threads: int = option(0, "torch intra-op threads. 0: torch's default (all cores).")
    report: str = option("", "Also write the numbers as JSON to this path.")


def check_train(train: TrainConfig, shape: LlamaShape) -> None:
    """Value checks the types cannot express, before any corpus is read or model built."""
    if train.precision not in PRECISIONS:
        raise JobError(f"train.precision={train.precision!r}: use one of {PRECISIONS}")
    if train.save_dtype not in SAVE_DTYPES:
        raise JobError(f"train.save_dtype={train.save_dtype!r}: use one of {SAVE_DTYPES}")
    if min(train.steps, train.batch_size, train.seq_len, train.checkpoint_every) < 1:
        raise JobError("train.steps, train.batch_size, train.seq_len and train.checkpoint_every must be >= 1")
    if not 0.0 <= train.final_fraction < 1.0:
        raise JobError(f"train.final_fraction={train.final_fraction}: use a value in [0, 1)")
    longest = max(train.seq_len, train.final_seq_len if train.final_fraction > 0 else 0)
    if longest > shape.max_position_embeddings:
        raise JobError(
            f"windows of {longest} tokens exceed model.max_position_embeddings={shape.max_position_embeddings}: "
            "shorten train.seq_len / train.final_seq_len or raise the context"
        )
    if train.final_fraction > 0 and (train.batch_size * train.seq_len) % train.final_seq_len:
        raise JobError(
            f"train.final_seq_len={train.final_seq_len} must divide train.batch_size * train.seq_len = "
            f"{train.batch_size * train.seq_len} (tokens per step stay constant across phases)"
        )
    if shape.hidden_size % shape.num_attention_heads or shape.num_attention_heads % shape.num_key_value_heads:
        raise JobError(
            f"model.hidden_size={shape.hidden_size} must be a multiple of model.num_attention_heads="
            f"{shape.num_attention_heads}, itself a multiple of model.num_key_value_heads={shape.num_key_value_heads}"
        )


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
class HeadsTrainConfig:
    steps: int = option(1200, "Optimizer steps.")
    batch_size: int = option(8, "Sequences per step (each gives data.continuation_tokens labels to every head).")
    seed: int = option(0, "Seed of prompt sampling, head initialization and sequence order.")
    precision: str = option(
        "float32",
        f"One of {PRECISIONS}: autocast dtype of forward/backward. bfloat16 only pays on GPUs (or CPUs with "
        "bfloat16 matmuls): on AVX2 it is many times slower.",
    )
    device: str = option("auto", "auto: cuda when available, else cpu. Or any torch device string.")
    threads: int = option(0, "torch intra-op threads (generation and training). 0: torch's default (all cores).")
    checkpoint_every: int = option(100, "Save the resumable training state every this many steps.")
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
    train = config.train
    if train.precision not in PRECISIONS:
        raise JobError(f"train.precision={train.precision!r}: use one of {PRECISIONS}")
    if min(train.steps, train.batch_size, train.checkpoint_every) < 1:
        raise JobError("train.steps, train.batch_size and train.checkpoint_every must be >= 1")


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
    train = config.train
    if train.precision not in PRECISIONS:
        raise JobError(f"train.precision={train.precision!r}: use one of {PRECISIONS}")
    if min(train.steps, train.batch_size, train.checkpoint_every) < 1:
        raise JobError("train.steps, train.batch_size and train.checkpoint_every must be >= 1")


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
class FineTuneTrainConfig:
    """The train section of a job that collects data with the target, then trains on it (cllm, cmlm)."""

    steps: int = option(1000, "Optimizer steps.")
    batch_size: int = option(8, "Examples per step.")
    seed: int = option(0, "Seed of prompt sampling and of every random choice of the examples.")
    precision: str = option(
        "float32",
        f"One of {PRECISIONS}: autocast dtype of forward/backward. bfloat16 only pays on GPUs (or CPUs with "
        "bfloat16 matmuls).",
    )
    device: str = option("auto", "auto: cuda when available, else cpu. Or any torch device string.")
    threads: int = option(0, "torch intra-op threads (collection and training). 0: torch's default (all cores).")
    checkpoint_every: int = option(100, "Save the resumable training state every this many steps.")
    checkpoint_dir: str = option(
        "",
        "Where the resumable state and the collected data go; re-running the same command resumes from them. "
        "Empty: <output_dir>/checkpoint.",
    )
    save_dtype: str = option("float32", f"One of {SAVE_DTYPES}: dtype of the exported model.safetensors.")


def check_fine_tune(train: FineTuneTrainConfig) -> None:
    if train.precision not in PRECISIONS:
        raise JobError(f"train.precision={train.precision!r}: use one of {PRECISIONS}")
    if train.save_dtype not in SAVE_DTYPES:
        raise JobError(f"train.save_dtype={train.save_dtype!r}: use one of {SAVE_DTYPES}")
    if min(train.steps, train.batch_size, train.checkpoint_every) < 1:
        raise JobError("train.steps, train.batch_size and train.checkpoint_every must be >= 1")


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
    check_fine_tune(config.train)


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
class ExitsTrainConfig:
    steps: int = option(300, "Optimizer steps.")
    batch_size: int = option(8, "Windows of the corpus per step.")
    seq_len: int = option(128, "Tokens per window; each is a label: the target's final next-token distribution there.")
    seed: int = option(0, "Seed of window order and initialization.")
    precision: str = option(
        "float32", f"One of {PRECISIONS}: autocast dtype of the exits' forward/backward (bfloat16 only pays on GPUs)."
    )
    device: str = option("auto", "auto: cuda when available, else cpu. Or any torch device string.")
    threads: int = option(0, "torch intra-op threads. 0: torch's default (all cores).")
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
    check_fine_tune(config.train)
    if config.train.length_weight < 0:
        raise JobError(f"train.length_weight={config.train.length_weight}: use a value >= 0")
