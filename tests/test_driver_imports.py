"""A job's driver imports no torch, transformers or safetensors: a cold job's Ray start shares the
machine's cores with the driver's imports, and those three were most of them (`pipeline.cluster`).
Only the actors load models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HEAVY = ("torch", "transformers", "safetensors")

# Runs `accelgen` in a fresh interpreter, then prints which of HEAVY it imported as its last line.
_REPORTING = f"""
import json, sys
from jobs.cli import main
code = main(sys.argv[1:])
print(json.dumps({{"exit": code, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def _driver(*argv: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _REPORTING, *argv], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_cli_and_the_driver_import_without_torch():
    code = f"import sys, jobs.cli, pipeline.driver; print([m for m in {HEAVY!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def test_a_whole_job_leaves_torch_to_its_actor(tiny_model_dir: Path, tmp_path: Path):
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"prompt": ["def f(x):", "x = 1"]}), tmp_path / "in" / "shard.parquet")
    report = _driver(
        "generate",
        f"input.url={tmp_path / 'in'}",
        f"output.url={tmp_path / 'out'}",
        f"model.target={tiny_model_dir}",
        "model.heads=null",
        "model.exits=null",
        "model.eagle=null",
        "model.draft=null",
        "model.cmlm=null",
        "generation.max_new_tokens=4",
    )
    assert report == {"exit": 0, "heavy": []}
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert sum(pq.read_table(tmp_path / "out" / p["part"]).num_rows for p in manifest["parts"]) == 2
