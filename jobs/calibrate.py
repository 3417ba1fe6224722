"""`accelgen calibrate calm`: the CALM threshold that keeps a target share of tokens equal to the full model's.

CALM is lossy: the lower its threshold, the earlier tokens exit and the more of them differ from
what the target's last layer would say. On the user's own prompts this command decodes greedily with
the full model, then with CALM at each candidate threshold, and prints the curve: mean exit layer,
speed against plain greedy decoding (same prompts, same batches), agreement (the share of CALM's
tokens equal to the full model's greedy choice after the same prefix, which is what the threshold
controls) and the share of output positions equal to full greedy decoding (which falls faster: one
differing token changes the rest of the row). The chosen threshold is the one with the shallowest
mean exit layer whose agreement reaches `target_agreement`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import torch

from jobs.bench import read_prompts
from jobs.cli import SAMPLE_PROMPTS, SHIPPED_EXITS, SHIPPED_TARGET, print_keys, split_args
from pipeline.config import load_config, option
from pipeline.errors import JobError
from strategies.calm import Calibration, calibrate
from strategies.options import CalmOptions
from workers.model_loading import load_models, resolve_dtype


@dataclass
class CalibrateConfig:
    prompts: str = option(str(SAMPLE_PROMPTS), "Prompts: a Parquet URL, or a JSONL(.gz) file with a prompt field.")
    prompt_column: str = option("prompt", "Column (Parquet) or field (JSONL) holding the prompt.")
    num_prompts: int = option(16, "The first this many prompts are decoded.")
    max_prompt_tokens: int = option(256, "Prompts are cut to their last this many tokens.")
    model: str = option(str(SHIPPED_TARGET), "Target model: local folder or fsspec URL.")
    exits: str = option(str(SHIPPED_EXITS), "Exit heads of the target (`accelgen train exits`).")
    dtype: str = option("auto", "Model dtype; auto: float32 on CPU, bfloat16 on GPU.")
    max_new_tokens: int = option(64, "Tokens generated per row (greedy, EOS ignored).")
    batch_size: int = option(8, "Rows decoded together.")
    thresholds: list[float] = option(
        [0.5, 0.7, 0.8, 0.9, 0.95, 0.99], "Candidate values of strategy.calm.threshold, each decoded once."
    )
    target_agreement: float = option(0.95, "Share of tokens that must equal the full model's greedy choice.")
    repeats: int = option(1, "Timed passes per threshold, each after a greedy pass; the curve shows medians.")
    calm: CalmOptions = field(default_factory=CalmOptions)
    torch_threads: int = option(0, "torch threads; 0: all cores.")
    report: str = option("", "Also write the curve and the choice as JSON to this path.")


def run(config: CalibrateConfig) -> Calibration:
    """Load the target and its exits, calibrate, print the curve and the choice."""
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    if not 0 < config.target_agreement <= 1 or min(config.batch_size, config.repeats) < 1 or not config.thresholds:
        raise JobError("target_agreement must be in (0, 1], batch_size and repeats >= 1, thresholds non-empty")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        loaded = load_models(config.model, resolve_dtype(config.dtype, device), device, exits_url=config.exits)
    except (OSError, ValueError) as exc:
        raise JobError(f"exits={config.exits!r}: {exc}") from None
    texts = read_prompts(config.prompts, config.prompt_column)[: config.num_prompts]
    if not texts:
        raise JobError(f"prompts {config.prompts} hold no prompts in {config.prompt_column!r}")
    prompts = [ids[-config.max_prompt_tokens :] for ids in loaded.tokenizer(texts)["input_ids"]]
    models = loaded.models
    result = calibrate(
        models.target,
        models.exits,
        config.calm,
        prompts,
        config.max_new_tokens,
        list(config.thresholds),
        config.target_agreement,
        config.batch_size,
        config.repeats,
    )
    print_curve(result, config)
    if config.report:
        with open(config.report, "w") as f:
            json.dump(asdict(result), f, indent=1)
    return result


def print_curve(result: Calibration, config: CalibrateConfig) -> None:
    print(f"calm ({config.calm.measure}, decay_tau {config.calm.decay_tau}, batch_exit {config.calm.batch_exit}):")
    print(f"{'threshold':>9}  {'exit layer':>10}  {'x greedy':>8}  {'agreement':>9}  {'same pos':>8}  {'wall_s':>7}")
    for p in result.points:
        speed = result.greedy_wall_s / p.wall_s if p.wall_s > 0 else float("nan")
        print(
            f"{p.threshold:>9.4g}  {p.mean_exit_layer:>10.2f}  {speed:>8.2f}  {p.agreement:>9.3f}  "
            f"{p.same_as_greedy:>8.3f}  {p.wall_s:>7.2f}"
        )
    print(f"greedy (full model): {result.greedy_wall_s:.2f} s")
    if result.chosen is None:
        print(f"no threshold reaches agreement {config.target_agreement}: try higher thresholds")
    else:
        print(f"chosen: strategy.calm.threshold={result.chosen.threshold:g} (agreement {result.chosen.agreement:.3f})")


def main(args: list[str]) -> int:
    if not args or args[0] != "calm" or "-h" in args or "--help" in args:
        print_keys("usage: accelgen calibrate calm [CONFIG.yaml] [key=value ...]\n\nkeys:", CalibrateConfig())
        return 0 if args and args[0] == "calm" else 2
    yaml_path, overrides = split_args(args[1:])
    run(load_config(CalibrateConfig(), yaml_path, overrides))
    return 0
