"""`accelgen bench costs=true`: the table that decides whether drafting can pay on this machine.

A drafting step pays when τ · (plain step) > (drafting step). Both sides are measured here, in one
run, on the bench's prompts and models:

- the target's forward in ms by batch size × new tokens per row (1, 2, 4, 8, 16 by default) over a
  cache of `cost_cache_tokens` per row, beside its arithmetic bound: the forward's matmul FLOPs
  (weights and attention over the cache) at the peak rate a large matmul reaches here through the
  forward's own `linear` (`strategies/runtime/linear.py`). A forward far above its bound is paying
  for launches, memory traffic or host work, not arithmetic;
- the plain step: what one autoregressive step of the batch at hand costs, host work included (the
  median step, each timed alone);
- for each drafting strategy, one drafting step split into where its time goes: propose, building
  the verify inputs, the target forward, acceptance, rollback of the rejected slots, and the rest
  (bookkeeping: the loop, the rows' finish checks, the proposers' updates). `host/plain` is the
  step's time outside the target forward over a plain step: what drafting costs besides the forward.

The phases are timed by wrapping the loop's collaborators for the duration of the measurement (the
proposer's `propose`, the verifier's input builder and its `accept`, the runner's
`forward`, the cache's rollback), so the decoding code carries no timers of its own.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from jobs.bench.decoding import Bench
from strategies.base import RowRequest
from strategies.runtime import kv_cache
from strategies.runtime.batch import decode_plainly, start_batch
from strategies.runtime.linear import linear
from strategies.runtime.runner import ModelRunner, synchronize
from strategies.runtime.sampling import row_key
from strategies.verification import speculative
from strategies.verification import verify as verifier

PHASES = ("propose", "verify_inputs", "forward", "accept", "rollback", "bookkeeping")


def peak_matmul_gflops(device: torch.device, dtype: torch.dtype, size: int = 1024, repeats: int = 5) -> float:
    """The best rate of a `size`³ matmul in `dtype` through the forward's own `linear` (packed weights
    where those run): the ceiling a forward's arithmetic could reach."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):  # the first call picks kernels
        synchronize(device)
        started = time.perf_counter()
        linear(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e9


def forward_flops(model: torch.nn.Module, batch: int, new_tokens: int, context: int) -> float:
    """Matmul FLOPs of one forward of `new_tokens` per row over `context` cached tokens: every linear
    layer (the LM head included) once per token, and attention's two products over the context."""
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    config = model.config
    attention = 4 * config.num_hidden_layers * config.hidden_size * (context + new_tokens)
    return batch * new_tokens * (2 * weights + attention)


def cache_rows(prompts: list[list[int]], batch_size: int, cache_tokens: int) -> list[list[int]]:
    """`batch_size` rows of exactly `cache_tokens` real tokens each: the prompts run together, each
    row starting further into them, so rows differ as a batch's prompts do."""
    stream = [t for p in prompts for t in p]
    stream = stream * (1 + (cache_tokens + batch_size) // len(stream))
    return [stream[i : i + cache_tokens] for i in range(batch_size)]


class PhaseClock:
    """Seconds spent in each phase, for the step being timed."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.verifies = 0
        self._depth = 0  # > 0 inside a verify call: forwards there are the verify forward

    def timed(self, phase: str, fn: Callable, only_in_verify: bool = False) -> Callable:
        def wrapper(*args, **kwargs):
            if only_in_verify and not self._depth:
                return fn(*args, **kwargs)
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[phase] += time.perf_counter() - started

        return wrapper

    def verify(self, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            self.verifies += 1
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1

        return wrapper

    def take(self) -> tuple[dict[str, float], int]:
        spent, verifies = dict(self.spent), self.verifies
        self.spent.clear()
        self.verifies = 0
        return spent, verifies


@contextmanager
def clocked(strategy: object, runner: ModelRunner, clock: PhaseClock) -> Iterator[None]:
    """Wrap the speculative loop's collaborators in `clock`'s timers while the block runs."""
    patches: list[tuple[object, str, object]] = [
        (speculative, "verify", clock.verify(speculative.verify)),
        (verifier, "verify_inputs", clock.timed("verify_inputs", verifier.verify_inputs)),
        (verifier, "accept", clock.timed("accept", verifier.accept)),
        (runner, "forward", clock.timed("forward", runner.forward, only_in_verify=True)),
        (kv_cache.RaggedKV, "invalidate", clock.timed("rollback", kv_cache.RaggedKV.invalidate, True)),
        (
            kv_cache.RaggedKV,
            "compact_if_wasteful",
            clock.timed("rollback", kv_cache.RaggedKV.compact_if_wasteful, True),
        ),
    ]
    for method in getattr(strategy, "drafters", {}).values():
        patches.append((method.proposer, "propose", clock.timed("propose", method.proposer.propose)))
    # Attributes are set past any freeze of a dataclass, and put back after.
    saved = [(owner, name, vars(owner).get(name)) for owner, name, _ in patches]
    for owner, name, wrapped in patches:
        _set(owner, name, wrapped)
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            if original is not None:
                _set(owner, name, original)
            elif isinstance(owner, type):
                delattr(owner, name)
            else:
                object.__delattr__(owner, name)


def _set(owner: object, name: str, value: object) -> None:
    if isinstance(owner, type):
        setattr(owner, name, value)
    else:
        object.__setattr__(owner, name, value)


def _steps(bench: Bench, strategy: object, runner: ModelRunner, batches: list[list[list[int]]]) -> dict:
    """Decode `batches` stepwise with one strategy instance (as a pass of the bench, or an actor, does),
    timing each step and its phases: totals over the drafting steps (those that verified once), the
    plain steps' time and tokens, and the emitted tokens per verify over all the batches."""
    clock = PhaseClock()
    totals = dict.fromkeys((*PHASES, "step"), 0.0)
    drafting = plain_steps = row_steps = emitted = 0
    plain_s = 0.0
    with clocked(strategy, runner, clock):
        for batch in batches:
            requests = [RowRequest(p, row_key(str(i))) for i, p in enumerate(batch)]
            decoding = strategy.open(requests, bench.params)
            clock.take()  # the prefill is not a step
            while True:
                decoding.finished()
                if not decoding.active():
                    break
                started = time.perf_counter()
                decoding.step()
                step_s = time.perf_counter() - started
                spent, verifies = clock.take()
                if verifies == 1:
                    drafting += 1
                    totals["step"] += step_s
                    for phase in PHASES[:-1]:
                        totals[phase] += spent.get(phase, 0.0)
                elif verifies == 0:
                    plain_steps += 1
                    plain_s += step_s
            stats = decoding.segment().stats
            row_steps += sum(stats.get("verify_steps", {}).values())  # a row's step: τ is per row, as the bench's
            emitted += sum(stats.get("verify_emitted", {}).values())
    totals["bookkeeping"] = totals["step"] - sum(totals[p] for p in PHASES[:-1])
    return {
        "drafting_steps": drafting,
        "totals_s": totals,
        "plain_steps": plain_steps,
        "plain_s": plain_s,
        "tau": emitted / row_steps if row_steps else None,
    }


def plain_step_ms(bench: Bench, runner: ModelRunner, batches: list[list[list[int]]]) -> float:
    """Median ms of one autoregressive step over every row of the batch at hand, as the decode loop
    records each step (its forward and the host work around it, `decode_plainly`), EOS ignored. Each
    step is timed alone, so that nothing outside a step (a prefill, a later batch, a slow first call)
    is spread over the steps, and what a step is does not rest on a count of steps assumed."""
    seconds: list[float] = []
    for prompts in batches:
        requests = [RowRequest(p, row_key(str(i))) for i, p in enumerate(prompts)]
        batch = start_batch(runner, requests, bench.params)  # the prefill: not a step
        while batch.active:
            run = decode_plainly(runner, batch)
            seconds += [s for s, rows in zip(run.seconds, run.rows, strict=True) if rows == len(prompts)]
            batch.keep(run.still)
    return 1e3 * statistics.median(seconds) if seconds else 0.0


def measure(bench: Bench) -> dict:
    """The whole cost table for `bench`'s batch sizes and strategies (every one but autoregressive)."""
    config = bench.config
    runner = bench.models.target
    model = runner.model
    device = runner.device
    peak = peak_matmul_gflops(device, next(model.parameters()).dtype)
    cache = config.cost_cache_tokens
    table: dict = {"peak_gflops": round(peak, 1), "cache_tokens": cache, "batches": []}
    for batch_size in config.batch_sizes:
        # As the bench's contenders and a job's actor start: packing chosen per row count, kernels built.
        runner.warm_up(batch_size)
        prompts = cache_rows(bench.prompts, batch_size, cache)
        forwards = []
        for n, seconds in runner.forward_seconds(prompts, config.cost_new_tokens, config.repeats).items():
            ms = 1e3 * statistics.median(seconds)  # a verify forward's shape (`ModelRunner.forward_seconds`)
            bound = 1e3 * forward_flops(model, batch_size, n, cache) / (peak * 1e9)
            forwards.append({"new_tokens": n, "forward_ms": ms, "bound_ms": bound})  # unrounded: a tiny bound is not 0
        # Every batch of the prompts, as the bench decodes them: at batch 1 the first alone is one
        # prompt, whose τ is its own luck.
        batches = bench.batches(batch_size)
        plain = statistics.median(plain_step_ms(bench, runner, batches) for _ in range(config.repeats))
        drafters = []
        for name in config.strategies:
            if name == "autoregressive":
                continue
            for label, options in bench.variants(name).items():
                runs = [_steps(bench, bench.fresh(options, batch_size), runner, batches) for _ in range(config.repeats)]
                drafters.append(_drafter_row(label, runs, plain))
        table["batches"].append(
            {
                "batch_size": batch_size,
                "forwards": forwards,
                "rows": sum(map(len, batches)),  # the rows the plain and drafting steps were timed over
                "plain_step_ms": round(plain, 3),
                "drafters": drafters,
            }
        )
    return table


def _drafter_row(name: str, runs: list[dict], plain_ms: float) -> dict:
    """Per-step ms of each phase (the median run by step time), host time over a plain step, the speed
    a step of this cost and τ gives over plain decoding, and the speed it would give with its target
    forward alone (its ceiling)."""
    steps = [r for r in runs if r["drafting_steps"]]
    if not steps:
        return {"strategy": name, "drafting_steps": 0}
    run = sorted(steps, key=lambda r: r["totals_s"]["step"] / r["drafting_steps"])[len(steps) // 2]
    per_step = {p: 1e3 * run["totals_s"][p] / run["drafting_steps"] for p in (*PHASES, "step")}
    host = per_step["step"] - per_step["forward"]
    tau = run["tau"]
    return {
        "strategy": name,
        "drafting_steps": run["drafting_steps"],
        "tau": round(tau, 3) if tau else None,
        "ms": {p: round(v, 3) for p, v in per_step.items()},
        "host_over_plain": round(host / plain_ms, 3),
        "x_plain": round(tau * plain_ms / per_step["step"], 3) if tau else None,
        # The same step with no host work at all: no cut of host work passes it, only a higher τ or a
        # cheaper verify forward does.
        "x_ceiling": round(tau * plain_ms / per_step["forward"], 3) if tau and per_step["forward"] else None,
    }


def print_table(table: dict) -> None:
    print(f"peak matmul rate {table['peak_gflops']} GFLOP/s; cache {table['cache_tokens']} tokens per row")
    for entry in table["batches"]:
        b = entry["batch_size"]
        print(f"\nbatch {b}: target forward, ms (arithmetic bound at the peak rate)")
        print(
            "  "
            + "  ".join(
                f"{f['new_tokens']:>3} new: {f['forward_ms']:7.2f} ({f['bound_ms']:.2f})" for f in entry["forwards"]
            )
        )
        print(f"  plain step: {entry['plain_step_ms']:.2f} ms; steps below over {entry['rows']} rows")
        if entry["drafters"]:
            print(
                f"  {'strategy':<18} {'tau':>5} {'step':>7} "
                + " ".join(f"{p:>13}" for p in PHASES)
                + f" {'host/plain':>10} {'x plain':>8} {'ceiling':>8}"
            )
        for d in entry["drafters"]:
            if not d["drafting_steps"]:
                print(f"  {d['strategy']:<18} no drafting step")
                continue
            ms = d["ms"]
            print(
                f"  {d['strategy']:<18} {d['tau'] or 0:>5.2f} {ms['step']:>7.2f} "
                + " ".join(f"{ms[p]:>13.2f}" for p in PHASES)
                + f" {d['host_over_plain']:>10.2f} {d['x_plain'] or 0:>8.2f} {d['x_ceiling'] or 0:>8.2f}"
            )
    print("\nms per drafting step; host/plain: the step's time outside the target forward over a plain step;")
    print("x plain: tau x plain step / drafting step, the speed-up this step cost and tau give;")
    print("ceiling: tau x plain step / its forward, the speed-up with no host work: only tau or the forward move it.")
