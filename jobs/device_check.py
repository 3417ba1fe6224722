"""The device check: one command for a GPU machine lent for a few minutes, results as JSON under `$OUT`.

    make device-check                      # or: python -m jobs.device_check [--dry-run] [--out DIR]

Steps, each in a process of its own with a time limit, the JSON rewritten after each (a run cut
short still leaves what it measured):
1. environment: torch, CUDA device; packages this project needs that the machine lacks are
   installed from wheels carried in `.whl/` (`make device-wheels` downloads them here);
2. the float64 equivalence tests that need no Ray (`EQUIVALENCE_TESTS`) on the device: every `ModelRunner` the tests
   build moves its model to the device, and new tensors default to it (this module is also the pytest
   plugin that does it); the JSON lists each failure and the devices the runners ran on;
3. the 7B-shaped twin of the shipped family, made in the GPU's memory in bfloat16, decoded with
   `autoregressive`, `eagle` and `auto` at batch 1 and 8 (`jobs.twin.device_step`);
4. `accelgen bench` in bfloat16, every strategy on the shipped target, at batch 1, 8 and 64;
5. a profile of `auto` against `autoregressive` at batch 1: torch.profiler's top operations and the
   step's parts (drafting, verify, plain steps, controller, host syncs).
The steps' limits (`STEP_LIMITS_S`) add up to 9 minutes on a GPU machine, so that the whole check, with the
interpreter's start, fits in one call of under 10 minutes on one H100. CUDA graphs of the plain and
verify steps are not built yet: every strategy here launches its kernels from Python.
`--dry-run` runs every step on this machine's CPU at toy sizes (float32, few tokens), to prove the
script end to end without a device.
Writes `device_check.json` and `device_check.log` under `--out` (default `$OUT`, else `out/device`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".whl"
# Imported by the bench and the tests, and missing from the GPU machines' image (see `make device-wheels`).
NEEDED_MODULES = ("omegaconf", "antlr4")
# The float64 equivalence tests that need no Ray: the GPU image has none, and its wheel is larger than
# what can be carried there (test_medusa, test_early_exit, test_mask_predict and test_logprobs import it).
EQUIVALENCE_TESTS = [
    "tests/test_autoregressive.py",
    "tests/test_llama_forward.py",
    "tests/test_kv_cache.py",
    "tests/test_speculative.py",
    "tests/test_jacobi.py",
    "tests/test_retrieval.py",
]
DRY_RUN_TESTS = ["tests/test_speculative.py", "-k", "test_speculative_equals_autoregressive and batch1"]
TEST_DEVICE_ENV, RUNNER_DEVICES_ENV = "ACCELGEN_TEST_DEVICE", "ACCELGEN_RUNNER_DEVICES"
# (batch size, prompts decoded per contender): batch 1 over few prompts keeps the step inside its limit.
BENCH_SIZES = ((1, 4), (8, 16), (64, 64))
SYNC_OPS = (
    "aten::item",
    "aten::_local_scalar_dense",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaMemcpyAsync",
)
PARTS = ("drafting", "verify", "plain_steps", "controller")
# (step, its time limit on a GPU machine, its limit in the dry run on a shared CPU), in the order the
# steps run: on a GPU machine 540 s in all.
STEP_LIMITS_S = (
    ("environment", 45, 60),
    ("equivalence_tests", 120, 600),
    ("twin_7b", 150, 600),
    ("bench_bfloat16", 165, 900),
    ("profile_batch1", 60, 600),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.device_check", description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="every step on this CPU at toy sizes")
    parser.add_argument("--out", default=os.environ.get("OUT") or "out/device", help="results folder")
    parser.add_argument("--profile-only", metavar="JSON", help=argparse.SUPPRESS)  # step 5's own process
    parser.add_argument("--twin-only", metavar="JSON", help=argparse.SUPPRESS)  # step 3's own process
    args = parser.parse_args(argv)
    if args.profile_only:
        Path(args.profile_only).write_text(json.dumps(profile(args.dry_run), indent=1))
        return 0
    if args.twin_only:
        from jobs.twin.device_step import twin_step

        twin_step(args.dry_run, lambda found: Path(args.twin_only).write_text(json.dumps(found, indent=1)))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    check = Check(out, args.dry_run)
    steps = {
        "environment": check.environment,
        "equivalence_tests": check.tests,
        "twin_7b": check.twin,
        "bench_bfloat16": check.bench,
        "profile_batch1": check.profile,
    }
    for name, limit_s, dry_run_limit_s in STEP_LIMITS_S:
        check.step(name, dry_run_limit_s if args.dry_run else limit_s, steps[name])
    check.results["wall_s"] = round(time.perf_counter() - check.started, 1)
    check.save()
    print(f"device check: {json.dumps(check.results['status'])}; results in {out / 'device_check.json'}")
    return 0 if all(s == "ok" for s in check.results["status"].values()) else 1


class Check:
    def __init__(self, out: Path, dry_run: bool) -> None:
        self.out, self.dry_run = out, dry_run
        self.log = (out / "device_check.log").open("w")
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.results: dict[str, Any] = {"dry_run": dry_run, "status": {}}
        self.started = time.perf_counter()
        self.device = "cpu"

    def save(self) -> None:
        (self.out / "device_check.json").write_text(json.dumps(self.results, indent=1))

    def step(self, name: str, limit_s: int, fn) -> None:
        print(f"device check: {name} (at most {limit_s}s)", flush=True)
        began = time.perf_counter()
        try:
            self.results[name] = fn(limit_s)
            self.results["status"][name] = "ok"
        except Exception as exc:
            self.results["status"][name] = f"failed: {type(exc).__name__}: {str(exc)[-2000:]}"
        self.results.setdefault("step_s", {})[name] = round(time.perf_counter() - began, 1)
        self.save()

    def run(self, command: list[str], limit_s: int) -> None:
        """`command` with its output in the log; a CalledProcessError or TimeoutExpired when it fails."""
        self.log.write(f"$ {' '.join(command)}\n")
        self.log.flush()
        subprocess.run(command, stdout=self.log, stderr=subprocess.STDOUT, env=self.env, timeout=limit_s, check=True)

    def environment(self, limit_s: int) -> dict[str, Any]:
        missing = [m for m in NEEDED_MODULES if importlib.util.find_spec(m) is None]
        if missing:
            wheels = sorted(str(p) for p in WHEELS.glob("*.whl"))
            if not wheels:
                raise RuntimeError(
                    f"modules {missing} are missing and {WHEELS} holds no wheels: run make device-wheels"
                )
            site = Path(tempfile.gettempdir()) / "accelgen-site"
            pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site)]
            self.run([*pip, *wheels], limit_s)
            sys.path.insert(0, str(site))
            self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), self.env.get("PYTHONPATH")) if p)
        import torch

        cuda = torch.cuda.is_available() and not self.dry_run
        self.device = "cuda" if cuda else "cpu"
        return {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "installed_from_wheels": missing,
        }

    def tests(self, limit_s: int) -> dict[str, Any]:
        junit, devices = self.out / "tests.xml", Path(tempfile.mkstemp(suffix=".json")[1])
        self.env.update({TEST_DEVICE_ENV: self.device, RUNNER_DEVICES_ENV: str(devices)})
        selection = DRY_RUN_TESTS if self.dry_run else EQUIVALENCE_TESTS
        command = [sys.executable, "-m", "pytest", "-q", "-p", "jobs.device_check", f"--junitxml={junit}", *selection]
        with contextlib.suppress(subprocess.CalledProcessError):  # failures are counted from the report
            self.run(command, limit_s)
        summary = junit_summary(junit.read_text())
        junit.unlink()
        summary["runner_devices"] = json.loads(devices.read_text() or "{}")
        return summary

    def bench(self, limit_s: int) -> list[dict[str, Any]]:
        from strategies import registry

        rows: list[dict[str, Any]] = []
        report = Path(tempfile.mkstemp(suffix=".json")[1])
        if self.dry_run:
            sizes, extra = ((2, 2),), ["dtype=float32", "max_new_tokens=4", "repeats=1", "max_prompt_tokens=32"]
        else:
            sizes, extra = BENCH_SIZES, ["dtype=bfloat16", "max_new_tokens=64", "repeats=2"]
        strategies = f"strategies=[{','.join(registry.available())}]"
        deadline = time.perf_counter() + limit_s
        for batch_size, prompts in sizes:
            command = [sys.executable, "-m", "jobs.cli", "bench", strategies, f"batch_sizes=[{batch_size}]"]
            command += [f"num_prompts={prompts}", "transformers=[generate]", f"report={report}", *extra]
            self.run(command, max(int(deadline - time.perf_counter()), 1))
            rows.extend(json.loads(report.read_text()))
            self.results["bench_bfloat16"] = rows  # kept if a later batch size runs out of time
        return rows

    def profile(self, limit_s: int) -> dict[str, Any]:
        return self.own_process("--profile-only", "profile_batch1", limit_s)

    def twin(self, limit_s: int) -> dict[str, Any]:
        return self.own_process("--twin-only", "twin_7b", limit_s)

    def own_process(self, flag: str, name: str, limit_s: int) -> dict[str, Any]:
        """Step `name` as this module run with `flag`, which writes its results to a JSON file; what
        it wrote is kept under `name` if the process fails or runs out of time."""
        result = Path(tempfile.mkstemp(suffix=".json")[1])
        command = [sys.executable, "-m", "jobs.device_check", f"{flag}={result}"]
        try:
            self.run([*command, "--dry-run"] if self.dry_run else command, limit_s)
        finally:
            if result.read_text():
                self.results[name] = json.loads(result.read_text())
        return json.loads(result.read_text())


def junit_summary(xml: str) -> dict[str, Any]:
    """Counts and failures (test id and the message's first line) of a pytest JUnit XML report."""
    cases = ET.fromstring(xml).iter("testcase")
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures = []
    for case in cases:
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            counts["failed"] += 1
            message = (problem.get("message") or "").splitlines()
            failures.append({"test": f"{case.get('classname')}::{case.get('name')}", "message": message[:1]})
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failures": failures}


def pytest_configure(config) -> None:
    """As a pytest plugin (`-p jobs.device_check`): tests run on `$ACCELGEN_TEST_DEVICE`. New tensors
    default to it, and each `ModelRunner` moves its model there first; the devices runners ran on are
    counted into `$ACCELGEN_RUNNER_DEVICES` at the end of the session."""
    import torch

    from strategies.runtime.runner import ModelRunner

    device = os.environ.get(TEST_DEVICE_ENV, "cpu")
    torch.set_default_device(device)
    counts: dict[str, int] = {}
    original = ModelRunner.__init__

    @functools.wraps(original)
    def on_device(self, model, *args, **kwargs):
        original(self, model.to(device), *args, **kwargs)
        counts[str(self.device)] = counts.get(str(self.device), 0) + 1

    ModelRunner.__init__ = on_device
    config._accelgen_runner_devices = counts


def pytest_unconfigure(config) -> None:
    path = os.environ.get(RUNNER_DEVICES_ENV)
    if path:
        Path(path).write_text(json.dumps(getattr(config, "_accelgen_runner_devices", {})))


def profile(dry_run: bool) -> dict[str, Any]:
    """`auto` and `autoregressive` at batch 1 under torch.profiler: each one's wall time, its parts and
    host syncs (CPU time of the labelled calls), and the top operations."""
    import torch
    from torch.profiler import ProfilerActivity

    from jobs.shipped import SAMPLE_PROMPTS, SHIPPED_TARGET, shipped_or_none
    from pipeline.prompt_files import read_prompts
    from strategies import registry
    from strategies.base import GenerationParams, RowRequest
    from strategies.control import controller as controller_module
    from strategies.options import StrategyOptions
    from strategies.runtime.sampling import SamplingParams, row_key
    from workers.common.model_kinds import KINDS
    from workers.model_loading import load_models

    label_parts()
    cuda = torch.cuda.is_available() and not dry_run
    device = torch.device("cuda" if cuda else "cpu")
    loaded = load_models(
        str(SHIPPED_TARGET),
        torch.bfloat16 if cuda else torch.float32,
        device,
        {kind.name: shipped_or_none(kind.name) for kind in KINDS},
    )
    texts = read_prompts(str(SAMPLE_PROMPTS), "prompt")[: 2 if dry_run else 4]
    prompts = [ids[-256:] for ids in loaded.tokenizer(texts)["input_ids"]]
    tokens = 8 if dry_run else 64
    params = GenerationParams(tokens, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    found: dict[str, Any] = {"device": str(device), "tokens_per_row": tokens, "rows": len(prompts)}
    for name in ("autoregressive", "auto"):
        controller = controller_module.AdaptiveController() if name == "auto" else None
        strategy = registry.create(StrategyOptions(name=name), loaded.models, controller)

        def decode(strategy=strategy):
            for i, p in enumerate(prompts):
                strategy.generate([RowRequest(p, row_key(str(i)))], params)
            if cuda:
                torch.cuda.synchronize()

        decode()  # warm-up, and the controller's exploration
        began = time.perf_counter()
        decode()
        wall_s = time.perf_counter() - began
        with torch.profiler.profile(activities=activities) as prof:
            decode()
        found[name] = profile_summary(prof.key_averages(), wall_s, len(prompts) * tokens, cuda)
    found["auto_x_autoregressive"] = round(found["autoregressive"]["wall_s"] / found["auto"]["wall_s"], 3)
    return found


def label_parts() -> None:
    """Wrap the decoding code's functions that make up a step's `PARTS` in profiler labels, for the
    rest of this process: the profile then reads each part's time without the code carrying timers."""
    from torch.profiler import record_function

    from strategies.control import controller as controller_module
    from strategies.decoders import autoregressive
    from strategies.verification import speculative

    def labelled(owner, attribute: str, label: str) -> None:
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            with record_function(label):
                return original(*args, **kwargs)

        setattr(owner, attribute, wrapper)

    labelled(speculative, "verify", "verify")
    labelled(speculative, "decode_plainly", "plain_steps")
    labelled(autoregressive, "decode_plainly", "plain_steps")
    labelled(speculative.SpeculativeStrategy, "_drafts", "drafting")
    for method in ("plan", "observe", "start_batch"):
        labelled(controller_module.AdaptiveController, method, "controller")


def profile_summary(events, wall_s: float, tokens: int, cuda: bool) -> dict[str, Any]:
    """The parts, the host syncs and the top 25 operations by self time of one profiled pass."""
    by_name = {e.key: e for e in events}

    def ms(event, attribute: str) -> float:
        return round(getattr(event, attribute) / 1e3, 3)

    parts = {p: {"cpu_ms": ms(by_name[p], "cpu_time_total"), "calls": by_name[p].count} for p in PARTS if p in by_name}
    syncs = {
        s: {"cpu_ms": ms(by_name[s], "cpu_time_total"), "calls": by_name[s].count} for s in SYNC_OPS if s in by_name
    }
    device_attribute = "self_device_time_total"
    sort = device_attribute if cuda else "self_cpu_time_total"
    top = sorted((e for e in events if e.key not in PARTS), key=lambda e: getattr(e, sort), reverse=True)[:25]
    return {
        "wall_s": round(wall_s, 4),
        "tokens_per_s": round(tokens / wall_s, 1),
        "parts": parts,
        "host_syncs": syncs,
        "top_ops": [
            {
                "op": e.key,
                "calls": e.count,
                "self_cpu_ms": ms(e, "self_cpu_time_total"),
                "self_device_ms": ms(e, device_attribute) if cuda else None,
            }
            for e in top
        ],
    }


if __name__ == "__main__":
    sys.exit(main())
