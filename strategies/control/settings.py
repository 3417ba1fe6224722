"""What a controller is told (`ControllerSettings`) and what it learned that outlives it (`Learned`).

A controller lives as long as its actor, so what it learned carries over from batch to batch; across
jobs, `Learned` is saved at the end of a job and warm-starts the next job's controllers
(`workers/common/controller_stats.py`), which then explore only what it does not cover.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ControllerSettings:
    smoothing: float = 0.3  # weight in τ's moving average of a step over `smoothing_rows` rows
    # A step over fewer rows weighs less. At batch 1 each batch is one prompt, and the next prompt is not
    # like this one: τ averages over a few prompts, not over this prompt's luck.
    smoothing_rows: int = 64
    # Step times: the mean of this many recent measurements, outliers left out (a drafter's step ratios:
    # at least this many, `_row_window`).
    time_window: int = 9
    hysteresis: float = 0.05
    explore_steps: int = 2  # plain steps measured per bucket, and steps per drafter, before estimates count
    explore_rows: int = 8  # row steps per drafter, too: at batch 1, two steps are two tokens' luck
    probe_every: int = 24  # fewest steps between probes of one option
    max_probe_wait: int = 2048  # most steps between probes of one option
    probe_budget: float = 0.005  # share of the time all probes together may lose
    # A row step's gain over its drafter's mean gain, spread (standard deviation over mean), for how far
    # an estimate on n row steps may lie below the drafter's worth: `probe_spread` / √n (`_hopeful`). Set
    # at the top of the spreads the shipped drafters show under `auto` at batch 1.
    probe_spread: float = 0.8
    row_patience: int = 4
    row_cooldown: int = 16
    min_tree_nodes: int = 4
    # Row steps of a tree drafter at other budgets that halve what τ at a budget rests on
    # (`_tree_evidence`): about a pass over a small prompt set at batch 1.
    tree_half_life_rows: int = 512
    # Row steps decoded while a drafter that learns from what is emitted (a Lookahead trie) does not run
    # that halve the evidence behind its estimate (`_evidence`): its τ rises while it is idle.
    idle_half_life_rows: int = 512
    # Drafted row steps between draft-size decisions: at batch 1, a few prompts' worth, as a chain sized on
    # part of one prompt swings to a single token on a prompt that copies little.
    resize_rows: int = 64
    learn_above: float = 0.85  # a learning drafter sees batches while its estimate is above this
    explore_budget: float = 0.03  # share of the decode time that exploring steps which lose may take
    # A step wider than any forward measured at its bucket (to explore, or at a new bucket) is priced at
    # the cost model's extrapolation plus this share of it: the widest segment's slope is a guess beyond it.
    extrapolation_margin: float = 0.1
    # A drafter that pays gives way to another only on that one's estimate shrunk toward 1 by the row
    # steps it was measured over, n / (n + evidence_rows): a few steps of one prompt are its luck.
    evidence_rows: int = 64
    # A drafting choice and its draft sizes stand this many row steps (at batch 1, 8 steps) before every
    # option is weighed again: the estimates move over hundreds of row steps, and weighing every drafter
    # each step would cost a sizeable share of a plain step at batch 1.
    replan_rows: int = 8


@dataclass
class Learned:
    """What a controller learned that outlives its actor: step times by (option, batch bucket), each
    drafter's τ (over all, by batch bucket and node budget, and a tree drafter's by node budget), steps
    and row steps measured per option, draft sizes, and the cost model's forward
    times by (batch bucket, width) and host times by (drafter, batch bucket, width). Plain steps and plain
    forwards are kept in seconds, every other time as its ratio to a plain step's when it ran. Nothing
    in it decides a token: it only decides which lossless option runs and how long its drafts are."""

    row_time: dict[tuple[str, int], tuple[list[float], int]] = field(default_factory=dict)  # recent, count
    tau: dict[str, tuple[float, float]] = field(default_factory=dict)  # value, seen
    measured: dict[str, tuple[int, int]] = field(default_factory=dict)  # steps, row steps
    depth: dict[str, int] = field(default_factory=dict)
    nodes: dict[str, int] = field(default_factory=dict)
    forward_time: dict[tuple[int, int], tuple[list[float], int]] = field(default_factory=dict)  # (bucket, width)
    # (drafter, bucket, width)
    host_time: dict[tuple[str, int, int], tuple[list[float], int]] = field(default_factory=dict)
    tau_at: dict[tuple[str, int, int], tuple[float, float]] = field(default_factory=dict)  # (drafter, bucket, budget)
    tree_tau: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)  # (drafter, budget)
