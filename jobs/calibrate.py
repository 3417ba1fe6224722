"""`accelgen calibrate calm`: the CALM setting that keeps a target share of tokens equal to the full model's.

CALM is lossy: the lower its threshold, the earlier tokens exit and the more of them differ from
what the target's last layer would say. On the user's own prompts (or windows of the training
corpus's train split, `prompts=corpus`) this command decodes greedily with the full model, then with
CALM at each candidate measure and threshold, and prints the curve: mean exit layer,
speed against plain greedy decoding (same prompts, same batches), agreement (the share of CALM's
tokens equal to the full model's greedy choice after the same prefix, which is what the threshold
controls) and the share of output positions equal to full greedy decoding (which falls faster: one
differing token changes the rest of the row). The chosen setting is the one with the shallowest
mean exit layer whose agreement reaches `target_agreement`. `jobs/configs/calibrate_calm.yaml` is
the run that chose `CalmOptions`' shipped default.

The prompts are split in two halves, deterministically: prompts 0, 2, 4… (in file order) choose the
threshold, prompts 1, 3, 5… only report on it. A threshold picked and judged on the same prompts is
judged too kindly (the choice fits their noise); the held-out half's agreement is what to expect of
new prompts like them. Both halves' curves are printed.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from jobs.args import config_or_usage, print_keys
from jobs.shipped import SAMPLE_PROMPTS, SHIPPED_TARGET, shipped
from jobs.train.config import CorpusConfig
from jobs.train.corpus import load_corpus
from jobs.train.sequences import draw_prompts
from jobs.train.tokenizer import encode_documents
from pipeline.errors import JobError
from pipeline.prompt_files import read_prompts
from strategies.artifacts.exits import ExitHeads
from strategies.base import BatchOutput, GenerationParams, RowRequest, Strategy
from strategies.config_option import option
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.decoders.calm import CalmStrategy
from strategies.methods.calm import CALM_MEASURES, CalmOptions
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from workers.model_loading import load_models, resolve_dtype


@dataclass
class CurvePoint:
    """CALM at one measure and threshold on the calibration prompts."""

    measure: str
    threshold: float
    agreement: float  # share of its tokens equal to the full model's greedy choice after the same prefix
    same_as_greedy: float  # share of output positions equal to full-model greedy decoding's
    mean_exit_layer: float  # over every generated token (the first, the prefill's, at full depth)
    wall_s: float


@dataclass
class Calibration:
    greedy_wall_s: float  # plain greedy decoding of the calibration half, in the same batches
    points: list[CurvePoint]  # the calibration half (prompts 0, 2, 4…), which chooses
    chosen: CurvePoint | None  # the shallowest point meeting the agreement target; None: no threshold did
    held_out_greedy_wall_s: float  # plain greedy decoding of the held-out half
    held_out: list[CurvePoint]  # the held-out half (prompts 1, 3, 5…) at the same thresholds, which reports
    chosen_held_out: CurvePoint | None  # the chosen setting on the held-out half


def decode(
    strategy: Strategy, prompts: list[list[int]], params: GenerationParams, batch_size: int
) -> tuple[list[list[int]], list[BatchOutput], float]:
    """(outputs, batch outputs, wall seconds) of `strategy` over `prompts` in batches of `batch_size`."""
    outputs: list[list[int]] = []
    batches: list[BatchOutput] = []
    started = time.perf_counter()
    for first in range(0, len(prompts), batch_size):
        requests = [
            RowRequest(prompt=list(p), key=first + i) for i, p in enumerate(prompts[first : first + batch_size])
        ]
        batches.append(strategy.generate(requests, params))
        outputs += [r.tokens for r in batches[-1].rows]
    return outputs, batches, time.perf_counter() - started


def full_model_choices(runner: ModelRunner, prompts: list[list[int]], outputs: list[list[int]]) -> list[list[int]]:
    """Per row, the target's greedy choice after each prefix prompt + output[:j], j < len(output): what
    the full model would have emitted at each of the row's positions (one teacher-forced forward)."""
    sequences = [p + o[:-1] for p, o in zip(prompts, outputs, strict=True)]
    width = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    valid = torch.zeros(len(sequences), width, dtype=torch.bool)
    for row, seq in enumerate(sequences):
        ids[row, width - len(seq) :] = torch.tensor(seq)
        valid[row, width - len(seq) :] = True
    positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
    device = runner.device
    kv = runner.new_kv(len(sequences))
    logits = runner.forward(kv, ids.to(device), positions.to(device), valid.to(device)).logits  # [B, W, V]
    argmax = logits.argmax(dim=-1).tolist()
    return [row[width - len(o) :] for row, o in zip(argmax, outputs, strict=True)]


def agreement(runner: ModelRunner, prompts: list[list[int]], outputs: list[list[int]], batch_size: int) -> float:
    """The share of `outputs`' tokens equal to the full model's greedy choice after the same prefix."""
    same = total = 0
    for first in range(0, len(prompts), batch_size):
        chunk = outputs[first : first + batch_size]
        full = full_model_choices(runner, prompts[first : first + batch_size], chunk)
        same += sum(a == b for f, o in zip(full, chunk, strict=True) for a, b in zip(f, o, strict=True))
        total += sum(len(o) for o in chunk)
    return same / max(1, total)


def calibrate(
    runner: ModelRunner,
    exits: ExitHeads,
    options: CalmOptions,
    prompts: list[list[int]],
    max_new_tokens: int,
    thresholds: list[float],
    target: float,
    batch_size: int,
    repeats: int = 1,
    measures: tuple[str, ...] = (),
) -> Calibration:
    """The setting chosen on prompts 0, 2, 4… (of every measure in `measures`, or `options.measure` alone,
    at every threshold: the shallowest mean exit layer whose agreement reaches `target`), and the curve
    of prompts 1, 3, 5… at the same settings, which reports on the choice."""
    if len(prompts) < 2:
        raise JobError(f"calibration needs at least 2 prompts (one to choose, one to report on), got {len(prompts)}")
    settings = [(m, t) for m in measures or (options.measure,) for t in thresholds]
    greedy_wall_s, points = curve(runner, exits, options, prompts[0::2], max_new_tokens, settings, batch_size, repeats)
    held_wall_s, held_out = curve(runner, exits, options, prompts[1::2], max_new_tokens, settings, batch_size, repeats)
    meeting = [p for p in points if p.agreement >= target]
    chosen = min(meeting, key=lambda p: (p.mean_exit_layer, -p.agreement)) if meeting else None
    chosen_held_out = None if chosen is None else held_out[points.index(chosen)]
    return Calibration(greedy_wall_s, points, chosen, held_wall_s, held_out, chosen_held_out)


def curve(
    runner: ModelRunner,
    exits: ExitHeads,
    options: CalmOptions,
    prompts: list[list[int]],
    max_new_tokens: int,
    settings: list[tuple[str, float]],
    batch_size: int,
    repeats: int,
) -> tuple[float, list[CurvePoint]]:
    """CALM at each (measure, threshold) of `settings` on `prompts` (greedy, EOS ignored): its agreement
    with the full model and its speed (the median of `repeats` passes, each after a greedy pass, on a
    machine that drifts); and plain greedy decoding's median wall time."""
    params = GenerationParams(max_new_tokens, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    plain = AutoregressiveStrategy(runner)
    greedy, _, _ = decode(plain, prompts, params, batch_size)
    greedy_walls = []
    points = []
    for measure, threshold in settings:
        strategy = CalmStrategy(runner, exits, dataclasses.replace(options, measure=measure, threshold=threshold))
        walls = []
        for _ in range(repeats):
            greedy_walls.append(decode(plain, prompts, params, batch_size)[2])
            outputs, batches, wall_s = decode(strategy, prompts, params, batch_size)
            walls.append(wall_s)
        positional = sum(a == b for o, g in zip(outputs, greedy, strict=True) for a, b in zip(o, g, strict=True))
        tokens = sum(len(o) for o in outputs)
        depth = sum(b.stats["mean_exit_layer"] * sum(len(r.tokens) for r in b.rows) for b in batches)
        points.append(
            CurvePoint(
                measure=measure,
                threshold=threshold,
                agreement=agreement(runner, prompts, outputs, batch_size),
                same_as_greedy=positional / max(1, tokens),
                mean_exit_layer=depth / max(1, tokens),
                wall_s=statistics.median(walls),
            )
        )
    return statistics.median(greedy_walls), points


CORPUS_PROMPTS = "corpus"  # `prompts=corpus`: windows of the training corpus's train split


@dataclass
class CalibrateConfig:
    prompts: str = option(
        str(SAMPLE_PROMPTS),
        f"Prompts: a Parquet URL, a JSONL(.gz) file with a prompt field, or {CORPUS_PROMPTS!r}: windows of "
        "max_prompt_tokens tokens at random offsets (seed) of the training corpus's train split (corpus.*): "
        "neither its held-out files nor benchmark prompts.",
    )
    prompt_column: str = option("prompt", "Column (Parquet) or field (JSONL) holding the prompt.")
    num_prompts: int = option(16, "The first this many prompts are decoded: the even ones choose, the odd ones report.")
    max_prompt_tokens: int = option(
        256, f"Prompts are cut to their last this many tokens; with prompts={CORPUS_PROMPTS}, each is this long."
    )
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    seed: int = option(0, f"Seed of the window offsets with prompts={CORPUS_PROMPTS}.")
    model: str = option(str(SHIPPED_TARGET), "Target model: local folder or fsspec URL.")
    exits: str = option(str(shipped("exits")), "Exit heads of the target (`accelgen train exits`).")
    dtype: str = option("auto", "Model dtype; auto: float32 on CPU, bfloat16 on GPU.")
    max_new_tokens: int = option(64, "Tokens generated per row (greedy, EOS ignored).")
    batch_size: int = option(8, "Rows decoded together.")
    thresholds: list[float] = option(
        [0.5, 0.7, 0.8, 0.9, 0.95, 0.99], "Candidate values of strategy.calm.threshold, each decoded once."
    )
    measures: list[str] = option(
        [],
        f"Candidate values of strategy.calm.measure ({', '.join(CALM_MEASURES)}), each at every threshold; "
        "empty: calm.measure.",
    )
    target_agreement: float = option(0.95, "Share of tokens that must equal the full model's greedy choice.")
    repeats: int = option(1, "Timed passes per threshold, each after a greedy pass; the curve shows medians.")
    calm: CalmOptions = field(default_factory=CalmOptions)
    torch_threads: int = option(0, "torch threads; 0: all cores.")
    report: str = option("", "Also write the curve and the choice as JSON to this local path.")


def run(config: CalibrateConfig) -> Calibration:
    """Load the target and its exits, calibrate, print the curve and the choice."""
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    if not 0 < config.target_agreement <= 1 or min(config.batch_size, config.repeats) < 1 or not config.thresholds:
        raise JobError("target_agreement must be in (0, 1], batch_size and repeats >= 1, thresholds non-empty")
    unknown = sorted(set(config.measures) - set(CALM_MEASURES))
    if unknown:
        raise JobError(f"measures={config.measures}: {unknown} are not CALM measures; use some of {CALM_MEASURES}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        loaded = load_models(config.model, resolve_dtype(config.dtype, device), device, {"exits": config.exits})
    except (OSError, ValueError) as exc:
        raise JobError(f"exits={config.exits!r}: {exc}") from None
    prompts = read_token_prompts(config, loaded.tokenizer)
    models = loaded.models
    exits = models.get("exits")
    if "classifier" in (config.measures or [config.calm.measure]) and not exits.has_classifier:
        raise JobError(
            f"measure classifier: the exits at {config.exits} have no classifier; train them with "
            "exits.classifier=true (accelgen train exits) or leave classifier out of measures"
        )
    result = calibrate(
        models.target,
        exits,
        config.calm,
        prompts,
        config.max_new_tokens,
        list(config.thresholds),
        config.target_agreement,
        config.batch_size,
        config.repeats,
        tuple(config.measures),
    )
    print_curve(result, config)
    if config.report:
        Path(config.report).parent.mkdir(parents=True, exist_ok=True)
        with open(config.report, "w") as f:
            json.dump(asdict(result), f, indent=1)
    return result


def read_token_prompts(config: CalibrateConfig, tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    """The first `num_prompts` prompts of `config.prompts`, as token ids of at most `max_prompt_tokens`."""
    if config.prompts == CORPUS_PROMPTS:
        tokens = encode_documents(tokenizer, load_corpus(config.corpus).train)  # [N]
        return draw_prompts(tokens, config.num_prompts, config.max_prompt_tokens, config.seed).tolist()
    texts = read_prompts(config.prompts, config.prompt_column)[: config.num_prompts]
    if not texts:
        raise JobError(f"prompts {config.prompts} hold no prompts in {config.prompt_column!r}")
    return [ids[-config.max_prompt_tokens :] for ids in tokenizer(texts)["input_ids"]]


def print_curve(result: Calibration, config: CalibrateConfig) -> None:
    measures = ", ".join(config.measures or [config.calm.measure])
    print(f"calm ({measures}; decay_tau {config.calm.decay_tau}, batch_exit {config.calm.batch_exit}):")
    halves = [
        ("calibration half (prompts 0, 2, 4…: chooses)", result.points, result.greedy_wall_s),
        ("held-out half (prompts 1, 3, 5…: reports)", result.held_out, result.held_out_greedy_wall_s),
    ]
    for title, points, greedy_wall_s in halves:
        print(title)
        print(
            f"{'measure':>10}  {'threshold':>9}  {'exit layer':>10}  {'x greedy':>8}  {'agreement':>9}  "
            f"{'same pos':>8}  {'wall_s':>7}"
        )
        for p in points:
            speed = greedy_wall_s / p.wall_s if p.wall_s > 0 else float("nan")
            print(
                f"{p.measure:>10}  {p.threshold:>9.4g}  {p.mean_exit_layer:>10.2f}  {speed:>8.2f}  "
                f"{p.agreement:>9.3f}  {p.same_as_greedy:>8.3f}  {p.wall_s:>7.2f}"
            )
        print(f"greedy (full model): {greedy_wall_s:.2f} s")
    if result.chosen is None or result.chosen_held_out is None:
        print(f"no setting reaches agreement {config.target_agreement} on the calibration half: try higher thresholds")
    else:
        chosen, held = result.chosen, result.chosen_held_out
        print(
            f"chosen: strategy.calm.threshold={chosen.threshold:g} strategy.calm.measure={chosen.measure} "
            f"(agreement {chosen.agreement:.3f} on the calibration half, {held.agreement:.3f} held out; "
            f"mean exit layer {held.mean_exit_layer:.2f} held out)"
        )
        if held.agreement < config.target_agreement:
            print(
                f"the held-out half falls short of agreement {config.target_agreement}: raise target_agreement "
                "or num_prompts"
            )


def main(args: list[str]) -> int:
    usage = "usage: accelgen calibrate calm [CONFIG.yaml] [key=value ...]"
    if not args or args[0] != "calm":
        print_keys(f"{usage}\n\nkeys:", CalibrateConfig())
        return 2
    config = config_or_usage(usage, CalibrateConfig(), args[1:])
    if config is not None:
        run(config)
    return 0
