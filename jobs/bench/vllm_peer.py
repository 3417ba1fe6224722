"""vLLM as a peer of `accelgen bench job=true`: its offline `generate` run in the virtual environment
that holds it (`vllm_python`, docs/benchmarks.md), as a separate process, since vLLM and this project's
dependencies do not share one environment. Its rate is of decoding alone."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any

import torch

from workers.model_loading import resolve_dtype

PEER_SCRIPT = Path(__file__).resolve().parents[1] / "peers" / "vllm_offline.py"
VLLM_PLAIN, VLLM_NGRAM = "vllm.generate", "vllm.ngram"
VLLM_PEERS = {"plain": VLLM_PLAIN, "ngram": VLLM_NGRAM}  # `vllm=[...]` -> contender


def vllm_runs(config: Any, texts: list[str], work: Path, method: str) -> dict[str, Any]:
    """vLLM's offline `generate` of `texts` in the peer environment: {load_s, generate_s: [...], tokens}."""
    if not config.vllm_python:
        return {
            "not_measured": "give vllm_python=/path/to/venv/bin/python "
            "(docs/benchmarks.md, 'Whole jobs, cold and warm, against peers')"
        }
    prompts = work / "vllm_prompts.json"
    prompts.write_text(json.dumps(texts))
    result = work / f"vllm_{method}.json"
    command = peer_command(config, prompts, result, method)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    log = work / f"vllm_{method}.log"
    with log.open("w") as out:
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    if code != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        return {"not_measured": f"{' '.join(command)} exited with {code}: {tail.strip()[-600:]}"}
    return json.loads(result.read_text())


def peer_command(config: Any, prompts: Path, result: Path, method: str) -> list[str]:
    """The peer script's command line: the bench's model, length and rounds, in the dtype our own
    contenders decode in on CPU (`resolve_dtype`: `auto` is float32 there), so that a bfloat16 bench
    does not set vLLM's float32 beside it."""
    dtype = str(resolve_dtype(config.dtype, torch.device("cpu"))).removeprefix("torch.")
    return [
        config.vllm_python,
        str(PEER_SCRIPT),
        f"--model={config.model}",
        f"--prompts={prompts}",
        f"--max-tokens={config.max_new_tokens}",
        f"--repeats={config.repeats}",
        f"--method={method}",
        f"--dtype={dtype}",
        f"--out={result}",
    ]


def vllm_row(batch_size: int, name: str, result: dict[str, Any]) -> dict[str, Any]:
    """A row for vLLM's run: the median `generate` time (engine start-up, `load_s`, reported apart)."""
    if "not_measured" in result:
        return {"batch_size": batch_size, "contender": name, "mode": "peer", "not_measured": result["not_measured"]}
    generate_s = statistics.median(result["generate_s"])
    return {
        "batch_size": batch_size,
        "contender": name,
        "mode": "peer",
        "wall_s": round(generate_s, 3),
        "outside_decoding_s": None,
        "decode_s": round(generate_s, 3),
        "decode_tokens_per_s": round(result["tokens"] / generate_s, 1),
        "tokens": result["tokens"],
        "x_autoregressive_wall": None,
        "x_autoregressive_decode": None,
        "x_autoregressive_decode_range": None,
        "x_in_process": None,
        "engine_start_s": round(result["load_s"], 1),
        "passes": len(result["generate_s"]),
    }
