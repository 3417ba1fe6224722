"""`accelgen bench` in process, its default mode: our strategies against transformers' `generate`, side by side.

Every contender decodes the same prompts (the first `num_prompts`, cycled to fill a batch) in
batches of each batch size, for the same fixed length (EOS ignored; `min_new_tokens` for
transformers). Repeats are interleaved, and within a round the contenders take turns batch by batch
in alternating order (`rounds.in_turns`), so drift on a noisy machine and the position in a round hit all
contenders alike. The table reports medians, ratios to `transformers.generate` and to our
`autoregressive`, τ and acceptance by position (`strategies/verification/metrics.py`), and the share
of rows whose tokens equal `generate`'s greedy output in the working dtype (docs/design.md,
"Determinism": a different matmul shape can flip a near-tie).
transformers' assisted generation and prompt lookup run at batch 1 only: it refuses larger batches.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from jobs.bench.agreement import agreement
from jobs.bench.rounds import format_range, in_turns, paired, per_round, spread
from jobs.bench.settings import BenchConfig
from pipeline.errors import JobError
from pipeline.prompt_files import read_prompts
from strategies import registry
from strategies.base import GenerationParams, RowRequest
from strategies.control.controller import AdaptiveController
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.methods.chain import DRAFTERS
from strategies.methods.eagle import EAGLE_TREES
from strategies.methods.prompt_lookup import PROMPT_LOOKUP_SIZINGS
from strategies.options import StrategyOptions
from strategies.runtime import linear
from strategies.runtime.heap import freeze_loaded
from strategies.runtime.sampling import SamplingParams, row_key
from workers.common.model_kinds import needed_by
from workers.model_loading import LoadedModels, load_models, resolve_dtype
from workers.rows import repetition_rate
from workers.warm_up import timed_forwards

T = TypeVar("T")
HF_GENERATE, HF_ASSISTED, HF_LOOKUP = "transformers.generate", "transformers.assisted", "transformers.prompt_lookup"
JACOBI_COUNTS = ("iterations", "blocks", "committed", "fast_forwarded", "stationary")


@dataclass(frozen=True)
class Sweep:
    """A bench key listing values of one strategy option: each value makes a contender of each strategy
    it names, labelled "<strategy> <label>=<value>"."""

    key: str  # the bench's list of values
    strategies: tuple[str, ...]
    section: str | None  # the option's section, `strategy.<section>`; None: the strategy's own; "": `strategy`
    field: str
    label: str
    allowed: tuple[str, ...] | None = None  # None: any value the option takes


SWEEPS = (
    Sweep("mask_predict_iterations", (registry.MASK_PREDICT,), "mask_predict", "iterations", "T"),
    Sweep("drafters", ("speculative", "specdec"), None, "drafter", "drafter", DRAFTERS),
    Sweep("lookup_sizings", ("prompt_lookup",), "prompt_lookup", "sizing", "sizing", PROMPT_LOOKUP_SIZINGS),
    Sweep("eagle_trees", ("eagle",), "eagle", "tree", "tree", EAGLE_TREES),
    Sweep("lookahead_nodes", ("lookahead",), "lookahead", "decoding_length", "nodes"),
    Sweep("lookahead_lookup_first", ("lookahead",), "lookahead", "prompt_lookup_first", "lookup_first"),
    # Only a contender under the controller grows its drafts: `auto`, or one with strategy.adaptive=true.
    Sweep(
        "adaptive_growths",
        (registry.AUTO, "speculative", "specdec", "self_speculative", "blockwise", "eagle", "lookahead"),
        "",
        "adaptive_growth",
        "growth",
    ),
)


Pass = Callable[[list], "Run"]  # a contender's timed pass: it decodes the batches it is given, in turn
Starter = Callable[[], Pass]  # starts a new pass of a contender


def _swept(options: StrategyOptions, sweep: Sweep, value: object) -> StrategyOptions:
    """`options` with `sweep`'s option set to `value`."""
    if sweep.section == "":
        return dataclasses.replace(options, **{sweep.field: value})
    section = sweep.section or options.name
    changed = dataclasses.replace(getattr(options, section), **{sweep.field: value})
    return dataclasses.replace(options, **{section: changed})


@dataclass
class Run:
    """One timed pass of a contender over all its batches."""

    wall_s: float
    tokens: list[list[int]]
    stats: list[dict] = field(default_factory=list)  # ours only: each batch's speculation metrics

    @classmethod
    def joined(cls, parts: list[Run]) -> Run:
        """One pass of the parts, each a pass over some of its batches, in order."""
        tokens = [t for p in parts for t in p.tokens]
        return cls(sum(p.wall_s for p in parts), tokens, [s for p in parts for s in p.stats])

    def tau(self) -> float | None:
        """Tokens per verify step over the pass (`strategies.verification.metrics`); None without verify steps."""
        steps = sum(sum(s.get("verify_steps", {}).values()) for s in self.stats)
        emitted = sum(sum(s.get("verify_emitted", {}).values()) for s in self.stats)
        return emitted / steps if steps else None

    def acceptance_by_position(self) -> list[float]:
        """Per draft depth d+1 (per head, for heads): verify steps accepting it over those reaching it."""
        reached: list[int] = []
        accepted: list[int] = []
        for s in self.stats:
            for counts, add in ((reached, s.get("reached_depth", [])), (accepted, s.get("accepted_at", []))):
                counts.extend([0] * (len(add) - len(counts)))
                for d, n in enumerate(add):
                    counts[d] += n
        accepted.extend([0] * (len(reached) - len(accepted)))
        return [round(a / r, 3) for a, r in zip(accepted, reached, strict=True) if r]

    def jacobi(self) -> dict[str, float] | None:
        """Jacobi's trajectory signatures over the pass (`strategies.proposers.jacobi`), when it ran."""
        counts = {k: sum(s.get(f"jacobi_{k}", 0) for s in self.stats) for k in JACOBI_COUNTS}
        if not counts["iterations"]:
            return None
        return {
            "iterations_per_block": round(counts["iterations"] / counts["blocks"], 3),
            "committed_per_iteration": round(counts["committed"] / counts["iterations"], 3),
            "fast_forwarded": counts["fast_forwarded"],
            "stationary": counts["stationary"],
        }


class Bench:
    def __init__(self, config: BenchConfig, loaded: LoadedModels | None = None) -> None:
        """`config.new_controllers`: each pass starts with a new controller, as a cold job's actor does
        (`accelgen bench job=true`); otherwise a contender's controller lives on from pass to pass (`fresh`).
        `loaded`: models already on their device (the device check's in-memory twin), instead of
        `config.model` and the models its strategies need."""
        self.config = config
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        linear.set_packing(config.pack_weights)
        if loaded is None:
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            loaded = self.load(resolve_dtype(config.dtype, self.device))
        else:
            self.device = loaded.target.device
        self.model, self.tokenizer, self.draft_model, self.models = (
            loaded.target,
            loaded.tokenizer,
            loaded.draft,
            loaded.models,
        )
        texts = read_prompts(config.prompts, config.prompt_column)
        if not texts:
            raise JobError(f"bench prompts {config.prompts} hold no prompts in {config.prompt_column!r}")
        self.prompts = [ids[-config.max_prompt_tokens :] for ids in self.tokenizer(texts)["input_ids"]]
        n = config.max_new_tokens
        self.params = GenerationParams(n, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        # By contender (its options, whole) and batch size: two variants of one strategy (a sweep's, or
        # `auto` with other candidates) learn apart, as two jobs' actors would.
        self.controllers: dict[tuple[str, int], AdaptiveController] = {}
        freeze_loaded()  # as a job's actor does once it has loaded its models

    def load(self, dtype: torch.dtype) -> LoadedModels:
        """`config.model` and the models the strategies (and transformers' assisted generation) need."""
        variants = [v for n in set(self.config.strategies) for v in self.variants(n).values()]
        needs = set().union(*(needed_by(v) for v in variants))
        if "assisted" in self.config.transformers:  # transformers' assisted generation drafts with the draft model
            needs.add("draft")
        return load_models(self.config.model, dtype, self.device, {k: getattr(self.config, k) for k in needs})

    def batches(self, batch_size: int, fill: bool = True) -> list[list[list[int]]]:
        """The first `num_prompts` prompts (cycled) in batches of `batch_size`. `fill`: cycled on to fill
        one whole batch where `num_prompts` is smaller; without, the `num_prompts` rows a job of them
        decodes (`job=true`: a batch size above it decodes one batch of `num_prompts` rows there)."""
        count = max(self.config.num_prompts, batch_size) if fill else self.config.num_prompts
        rows = [self.prompts[i % len(self.prompts)] for i in range(count)]
        return [rows[i : i + batch_size] for i in range(0, count, batch_size)]

    def hf(self, batches: list[list[list[int]]], **kwargs) -> Run:
        n, tokens = self.config.max_new_tokens, []
        started = time.perf_counter()
        for batch in batches:
            width = max(len(p) for p in batch)
            ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in batch], device=self.device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=self.device)
            with torch.inference_mode():
                out = self.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=n,
                    min_new_tokens=n,
                    do_sample=False,
                    pad_token_id=self.pad,
                    **kwargs,
                )
            tokens.extend(out[:, width:].tolist())
        return Run(time.perf_counter() - started, tokens)

    def ours(self, strategy, batches: list[list[list[int]]]) -> Run:
        tokens, stats = [], []
        started = time.perf_counter()
        for batch in batches:
            out = strategy.generate([RowRequest(p, row_key(str(i))) for i, p in enumerate(batch)], self.params)
            tokens.extend(r.tokens for r in out.rows)
            stats.append(out.stats)
        return Run(time.perf_counter() - started, tokens, stats)

    def fresh(self, options: StrategyOptions, batch_size: int, owner: str = ""):
        """A new strategy instance per timed pass: a Lookahead trie warmed by an earlier pass over the
        same prompts would have seen the answers. The controller, which learns step costs and not
        answers, lives on across passes as it lives on across batches in an actor, unless the bench was
        made with `new_controllers`; contenders of one options with different `owner`s (the structured
        bench's constrained and unconstrained rows, two jobs) have one each."""
        controller = None
        if options.name == registry.AUTO or options.adaptive:
            key = (repr(options), batch_size, linear.packing(), owner)  # F.linear's steps cost otherwise
            controller = self.controllers.get(key) if not self.config.new_controllers else None
            if controller is None:  # told what forwards cost at its batch size, as a job's actor tells its own
                controller = self.controllers[key] = AdaptiveController()
                controller.time_forwards(batch_size, timed_forwards(self.models.target, batch_size))
        return registry.create(options, self.models, controller)

    def with_f_linear(self, start: Starter) -> Starter:
        """`start`, its pass made and run with packed weights off (`compare_f_linear`)."""

        def unpacked(fn: Callable[[], T]) -> T:
            linear.set_packing(False)
            try:
                return fn()
            finally:
                linear.set_packing(self.config.pack_weights)

        def started() -> Pass:
            decode = unpacked(start)
            return lambda batches: unpacked(lambda: decode(batches))

        return started

    def contenders(self, batch_size: int) -> dict[str, Starter]:
        """Each contender's start of a timed pass (`Starter`): transformers' passes keep nothing between
        batches; ours make a new strategy (`fresh`) for each pass, which then decodes its batches in turn."""
        config = self.config
        self.models.target.warm_up(batch_size)  # as a job's actor does before its first batch
        found: dict[str, Starter] = {}
        if "generate" in config.transformers:
            found[HF_GENERATE] = lambda: self.hf
        if batch_size == 1 and "assisted" in config.transformers:
            found[HF_ASSISTED] = lambda: lambda b: self.hf(b, assistant_model=self.draft_model)
        if batch_size == 1 and "prompt_lookup" in config.transformers:
            tokens = config.lookup_tokens or config.strategy.num_speculative_tokens
            found[HF_LOOKUP] = lambda: lambda b: self.hf(b, prompt_lookup_num_tokens=tokens)
        for name in config.strategies:
            for label, variant in self.variants(name).items():
                found[label] = lambda o=variant: functools.partial(self.ours, self.fresh(o, batch_size))
                if config.compare_f_linear and linear.packing():
                    found[f"{label} F.linear"] = self.with_f_linear(found[label])
        return found

    def variants(self, name: str) -> dict[str, StrategyOptions]:
        """The contenders strategy `name` stands for, by label: one per value of a sweep that names it
        (`SWEEPS`), or itself, each with the config's `strategy.*` options."""
        options = dataclasses.replace(self.config.strategy, name=name)
        for sweep in SWEEPS:
            values = getattr(self.config, sweep.key)
            if name in sweep.strategies and values:
                return {f"{name} {sweep.label}={v}": _swept(options, sweep, v) for v in values}
        return {name: options}

    def greedy(self, batches: list[list[list[int]]]) -> list[list[int]]:
        """The target's greedy tokens for `batches` (not timed): what agreement is measured against."""
        return self.ours(AutoregressiveStrategy(self.models.target), batches).tokens

    def run(self, on_rows: Callable[[list[dict]], None] = lambda rows: None) -> list[dict]:
        """All batch sizes' rows; `on_rows` gets each batch size's as it completes (a long run that is
        stopped still leaves what it measured)."""
        rows = []
        for batch_size in self.config.batch_sizes:
            batches = self.batches(batch_size)
            contenders = self.contenders(batch_size)
            for start in contenders.values():  # warm-up: first calls allocate and pick kernels
                start()(batches[:1])
            runs = _runs_in_turns(contenders, batches, self.config.repeats)
            done = self._rows(batch_size, runs, self.greedy(batches))
            on_rows(done)
            rows.extend(done)
        return rows

    def _rows(self, batch_size: int, runs: dict[str, list[Run]], greedy: list[list[int]]) -> list[dict]:
        walls = {name: statistics.median(r.wall_s for r in rs) for name, rs in runs.items()}
        times = {name: [r.wall_s for r in rs] for name, rs in runs.items()}

        def ratio(reference: str, name: str) -> float | None:  # the reference's time over the contender's
            return round(paired(times[reference], times[name]), 3) if reference in times else None

        def ratio_range(reference: str, name: str) -> list[float] | None:
            return spread(per_round(times[reference], times[name])) if reference in times else None

        reference = runs[HF_GENERATE][-1].tokens if HF_GENERATE in runs else None
        greedy_texts = self.tokenizer.batch_decode(greedy)
        rows = []
        for name, rs in runs.items():
            last = rs[-1]
            total = sum(len(t) for t in last.tokens)
            row = {
                "batch_size": batch_size,
                "contender": name,
                "median_wall_s": round(walls[name], 6),
                "tokens_per_s": round(total / walls[name], 1),
                "x_generate": ratio(HF_GENERATE, name),
                "x_autoregressive": ratio("autoregressive", name),
                "x_autoregressive_range": ratio_range("autoregressive", name),
                # Per pass, then the median, as the times: under `auto` a pass's τ depends on its choices.
                "tau": _median_or_none([r.tau() for r in rs]),
                "acceptance_by_position": last.acceptance_by_position(),
                "jacobi": last.jacobi(),
                "rows_equal_to_generate": (
                    sum(a == b for a, b in zip(last.tokens, reference, strict=True)) / len(reference)
                    if reference
                    else None
                ),
                "repetition_rate": round(statistics.mean(repetition_rate(t) for t in last.tokens), 3),
                # Against the target's greedy output: 1 / 1 / 100 for every lossless strategy.
                "agreement": agreement(last.tokens, greedy, self.tokenizer.batch_decode(last.tokens), greedy_texts),
            }
            rows.append(row)
        return rows


def _runs_in_turns(contenders: dict[str, Starter], batches: list, repeats: int) -> dict[str, list[Run]]:
    """`repeats` passes of every contender over `batches`, taking turns batch by batch (`rounds.in_turns`)."""

    def by_batch(start: Starter) -> Callable[[], Callable[[int], Run]]:
        def started() -> Callable[[int], Run]:
            decode = start()
            return lambda i: decode([batches[i]])

        return started

    turns = in_turns({name: by_batch(start) for name, start in contenders.items()}, len(batches), repeats)
    return {name: [Run.joined(parts) for parts in rounds] for name, rounds in turns.items()}


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def print_header() -> None:
    print(
        f"{'batch':>5}  {'contender':<28} {'wall_s':>8} {'tokens/s':>9} {'x gen':>6} {'x AR':>6} {'AR range':>9} "
        f"{'tau':>5} {'same':>5} {'rep':>5} {'tokacc':>6} {'chrF':>5}  acceptance by position",
        flush=True,
    )


def print_rows(rows: list[dict]) -> None:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    for r in rows:
        print(
            f"{r['batch_size']:>5}  {r['contender']:<28} {r['median_wall_s']:>8.3f} {r['tokens_per_s']:>9.1f} "
            f"{fmt(r['x_generate'], '.2f'):>6} {fmt(r['x_autoregressive'], '.2f'):>6} "
            f"{format_range(r['x_autoregressive_range']):>9} "
            f"{fmt(r['tau'], '.2f'):>5} {fmt(r['rows_equal_to_generate'], '.0%'):>5} "
            f"{r['repetition_rate']:>5.2f} {r['agreement']['token_accuracy']:>6.3f} {r['agreement']['chrf']:>5.1f}  "
            f"{' '.join(f'{a:.2f}' for a in r.get('acceptance_by_position') or [])}"
            f"{'' if not r.get('jacobi') else '  jacobi ' + json.dumps(r['jacobi'])}",
            flush=True,
        )


# What the columns of `print_rows` mean, printed under the table.
LEGEND = """x gen / x AR: speed-up over transformers.generate / our autoregressive (median of per-round ratios);
AR range: the lowest and highest of the per-round ratios behind x AR (a difference inside it is noise);
tau: tokens per verify step (accepted draft tokens + the target's own), plain steps left out;
same: rows identical to generate's greedy output; rep: share of repeated 4-grams per completion;
tokacc / chrF: token accuracy and character n-gram F-score (0-100) against the target's greedy output;
acceptance by position: share of verify steps reaching draft depth d+1 that accepted it (per head)"""
