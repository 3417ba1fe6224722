"""`accelgen train COMMAND CONFIG.yaml key=value…`: build and measure the shipped model family.

The shipped family is rebuilt, in order, by:

    accelgen train tokenizer jobs/configs/train_tokenizer.yaml
    accelgen train lm jobs/configs/train_target.yaml
    accelgen train draft jobs/configs/train_draft.yaml
    accelgen train cllm jobs/configs/train_cllm.yaml
    accelgen train cmlm jobs/configs/train_cmlm.yaml
    accelgen train heads jobs/configs/train_heads.yaml
    accelgen train exits jobs/configs/train_exits.yaml
    accelgen train eagle jobs/configs/train_eagle.yaml
    accelgen train eval model=jobs/assets/models/target draft=jobs/assets/models/draft report=out/train/eval.json

Re-running an interrupted `lm`, `draft`, `cllm`, `cmlm`, `heads`, `exits` or `eagle` command resumes from
its checkpoint. `heads` measures its heads on held-out text as it ends; `heads-eval` measures saved heads again.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobs.train.config import DraftJobConfig, EvalJobConfig, LMJobConfig, TokenizerJobConfig
from jobs.train.config_fine_tune import CLLMJobConfig, CMLMJobConfig
from jobs.train.config_heads import EagleJobConfig, ExitsJobConfig, HeadsEvalJobConfig, HeadsJobConfig
from pipeline.config import describe, load_config
from pipeline.errors import JobError


@dataclass(frozen=True)
class Command:
    config: Callable[[], Any]  # the config dataclass holding the defaults
    runner: str  # "module:function" taking the config, imported only when the command runs
    summary: str


COMMANDS = {
    "tokenizer": Command(
        TokenizerJobConfig, "jobs.train.tokenizer:train_tokenizer", "train the byte-level BPE tokenizer"
    ),
    "lm": Command(LMJobConfig, "jobs.train.lm:train_lm", "train the target Llama from scratch"),
    "draft": Command(DraftJobConfig, "jobs.train.draft:train_draft", "distill the draft from the target"),
    "eval": Command(EvalJobConfig, "jobs.train.evaluate:evaluate", "held-out loss, agreement and decode speed"),
    "heads": Command(HeadsJobConfig, "jobs.train.heads:train_heads", "train draft heads on the frozen target"),
    "heads-eval": Command(
        HeadsEvalJobConfig, "jobs.train.heads:evaluate_heads", "per-head top-1/top-5 accuracy on held-out text"
    ),
    "cllm": Command(CLLMJobConfig, "jobs.train.cllm:train_cllm", "fine-tune a consistency model for Jacobi decoding"),
    "cmlm": Command(
        CMLMJobConfig, "jobs.train.cmlm:train_cmlm", "distill a conditional masked LM (Mask-Predict) from the target"
    ),
    "exits": Command(
        ExitsJobConfig, "jobs.train.exits:train_exits", "train exit heads at the frozen target's inner layers"
    ),
    "eagle": Command(
        EagleJobConfig, "jobs.train.eagle:train_eagle", "train an EAGLE head on the frozen target's features"
    ),
}


def main(argv: list[str]) -> int:
    """Run one training sub-command; returns the process exit status (2 for a user error)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    command = COMMANDS.get(name)
    if command is None:
        print(f"error: unknown train command {name!r}; available: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if "-h" in rest or "--help" in rest:
        print(_help(name, command))
        return 0
    yaml_path = rest[0] if rest and "=" not in rest[0] else None
    overrides = rest[1:] if yaml_path else rest
    module, function = command.runner.split(":")
    try:
        config = load_config(command.config(), yaml_path, overrides)
        getattr(importlib.import_module(module), function)(config)
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _usage() -> str:
    lines = ["usage: accelgen train COMMAND [CONFIG.yaml] [key=value ...]", "", "commands:"]
    lines += [f"  {name:<10} {command.summary}" for name, command in COMMANDS.items()]
    lines += ["", "accelgen train COMMAND --help lists every key with its default."]
    return "\n".join(lines)


def _help(name: str, command: Command) -> str:
    lines = [f"usage: accelgen train {name} [CONFIG.yaml] [key=value ...]", "", f"{command.summary}.", "", "keys:"]
    for key, default, help_text in describe(command.config()):
        lines.append(f"  {key} = {default}\n      {help_text}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
