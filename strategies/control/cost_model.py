"""What a token costs: the target's forward time by batch size and new tokens, learned online.

A forward over a batch of B rows with n new tokens each costs little more than a plain step while
the device is latency-bound and about n times as much once it is compute-bound; where that happens
depends on B, the device and the dtype (a tree nearly free at batch 1 may cost several plain steps at
batch 8). The controller cannot size drafts by acceptance alone: it sizes them by tokens per second,
τ(size) / cost(batch, size), with the cost from here.

The model (`ForwardCosts`) keeps, per batch bucket, the recent plain forward time per row (width 1)
and, per wider width n (new tokens per row, the pending token included), the recent ratio of such a
forward to the plain one at its bucket when it ran: a machine's speed drifts with what else runs on
it, and a wide forward measured while it was loaded, set against plain steps measured since it was
quiet, would make every draft look hopeless, and keep it so, since a drafter judged hopeless is not
run to measure it again. A wide forward at a bucket with no plain forward yet is not kept (the
controller measures plain steps first at every bucket). Each is the median of its recent samples
(`RecentTime.median`: forwards of one width do the same work, and an interrupted one is an outlier).
A wider width enters the fit from its `FORWARD_SAMPLES`-th sample: until then it is extrapolated,
the optimistic side, so a drafter whose drafts would pay there runs it again. A forward over more
tokens never costs less, so the widths are fitted non-decreasing (`monotone_fit`): where a wider one
measured cheaper than a narrower, both take their mean weighted by their samples. A running maximum
over the means of every width instead let one dear sample at a width seldom run (the first step of a
pass drafting deeper than before) price every wider forward until that width ran again, and drafts
stayed shorter than they paid to be. Between measured widths the cost is interpolated linearly;
beyond the widest it extends the last segment's slope. Per-row time per width unit is the total time
per batch token, which is about the same at every batch size once compute-bound, so a bucket with
one measured width extends with the slope of the nearest bucket that has two; with none anywhere it
is flat (the optimistic side: that only decides whether a drafter is worth a first step, under the
exploration budget). Updating is one append per step; the fit, a pass over a bucket's widths, is
made once per change and kept for the queries.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from strategies.proposers.draft_sizing import best_length

FORWARD_SAMPLES = 3  # a width wider than the plain forward's enters the fit from this many samples


@dataclass
class RecentTime:
    """The mean of the last `window` measurements, those over `outlier` times their median left out.

    Why not a moving average: step times on a shared machine have rare outliers of tens of times the
    usual (a garbage collection, another process), which it would carry for many steps. Why not the median:
    a drafter's steps have two costs, a verify when it drafted and a plain step plus the search when
    it found nothing, and the median of such a mix jumps from one to the other."""

    window: int
    outlier: float = 3.0
    recent: deque[float] = field(default_factory=deque)
    count: int = 0
    cached: float | None = field(default=None, repr=False, compare=False)  # value, until the next update

    def update(self, x: float) -> None:
        self.recent.append(x)
        if len(self.recent) > self.window:
            self.recent.popleft()
        self.count += 1
        self.cached = None

    @property
    def value(self) -> float:
        if self.cached is None:  # asked every step, over windows of a few hundred: one sort, no generator
            ordered = sorted(self.recent)
            kept = ordered[: bisect.bisect_right(ordered, self.outlier * median_of_sorted(ordered))]
            self.cached = math.fsum(kept) / len(kept)
        return self.cached

    @property
    def median(self) -> float:
        """For measurements of one kind of work, whose noise is one-sided (interruptions only slow a
        step): a dear one among few moves it not at all, where it moves the mean."""
        return median_of_sorted(sorted(self.recent))


def median_of_sorted(ordered: list[float]) -> float:
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def monotone_fit(points: dict[int, tuple[float, int]]) -> tuple[list[int], list[float]]:
    """Measured widths in order and their costs fitted non-decreasing, from `points` (width -> (cost, the
    measurements behind it)): adjacent widths out of order pool into their weighted mean until none are
    (pool adjacent violators: the least-squares non-decreasing fit), so a width measured once moves a
    well-measured neighbour little."""
    widths = sorted(points)
    pools: list[list[float]] = []  # [weighted sum, weight, widths pooled]
    for w in widths:
        cost, weight = points[w]
        pools.append([cost * weight, weight, 1])
        while len(pools) > 1 and pools[-2][0] * pools[-1][1] > pools[-1][0] * pools[-2][1]:
            total, weight, count = pools.pop()
            pools[-1][0] += total
            pools[-1][1] += weight
            pools[-1][2] += count
    return widths, [total / weight for total, weight, count in pools for _ in range(int(count))]


def interpolate(widths: list[int], costs: list[float], width: int, slope_beyond: float | None) -> float:
    """The cost at `width` from a `monotone_fit` curve: linear between measured widths, the narrowest's
    cost below it, and beyond the widest the last segment's slope (or `slope_beyond` with one measured
    width; None: flat)."""
    if width <= widths[0]:
        return costs[0]
    for i in range(1, len(widths)):
        if width <= widths[i]:
            w0, w1, c0, c1 = widths[i - 1], widths[i], costs[i - 1], costs[i]
            return c0 + (c1 - c0) * (width - w0) / (w1 - w0)
    slope = last_slope(widths, costs)
    if slope is None:
        slope = slope_beyond or 0.0
    return costs[-1] + slope * (width - widths[-1])


def last_slope(widths: list[int], costs: list[float]) -> float | None:
    """Cost per width unit of a curve's widest segment; None with one measured width."""
    if len(widths) < 2:
        return None
    return (costs[-1] - costs[-2]) / (widths[-1] - widths[-2])


@dataclass
class ForwardCosts:
    """Forward seconds per row by (batch bucket, width), from the steps a controller ran: `times` holds the
    plain forward's seconds at width 1 and, at wider widths, ratios to it (module docstring)."""

    window: int = 9
    times: dict[tuple[int, int], RecentTime] = field(default_factory=dict)
    curves: dict[int, tuple[list[int], list[float]]] = field(default_factory=dict)  # per bucket, until it changes

    def observe(self, b: int, width: int, row_seconds: float) -> None:
        if width > 1:
            plain = self.times.get((b, 1))
            if plain is None:
                return
            row_seconds /= plain.median
        self.times.setdefault((b, width), RecentTime(self.window)).update(row_seconds)
        self.curves.pop(b, None)

    def load(self, times: dict[tuple[int, int], RecentTime]) -> None:
        """Measurements of an earlier job (`AdaptiveController.warm_start`), over those of the same keys."""
        self.times.update(times)
        self.curves.clear()

    def covers(self, b: int) -> bool:
        return bool(self._curve(b)[0])

    def widths(self, b: int) -> list[int]:
        """The forward widths measured at bucket `b`, narrowest first: wider ones are extrapolated."""
        return self._curve(b)[0]

    def row_seconds(self, b: int, width: int) -> float | None:
        """A forward's seconds per row at bucket `b` and `width` new tokens per row; None: nothing measured at `b`."""
        widths, costs = self._curve(b)
        if not widths:
            return None
        return interpolate(widths, costs, width, self._slope_near(b) if len(widths) < 2 else None)

    def _curve(self, b: int) -> tuple[list[int], list[float]]:
        if b not in self.curves:
            plain = self.times.get((b, 1))
            points = {}
            if plain is not None:
                points = {
                    w: (t.median * (plain.median if w > 1 else 1.0), len(t.recent))
                    for (bb, w), t in self.times.items()
                    if bb == b and (w == 1 or len(t.recent) >= FORWARD_SAMPLES)
                }
            self.curves[b] = monotone_fit(points)
        return self.curves[b]

    def extrapolates(self, b: int) -> bool:
        """Whether widths beyond the widest measured at bucket `b` follow a measured slope (two widths there,
        or at another bucket), rather than the flat, optimistic line of a model that has seen one width."""
        return len(self.widths(b)) >= 2 or self._slope_near(b) is not None

    def _slope_near(self, b: int) -> float | None:
        """The widest segment's slope at the nearest bucket with two measured widths (the larger of two as near)."""
        slopes = {bb: last_slope(*self._curve(bb)) for bb in {key[0] for key in self.times}}
        known = [bb for bb, slope in slopes.items() if slope is not None]
        if not known:
            return None
        return slopes[min(known, key=lambda m: (abs(m.bit_length() - b.bit_length()), -m))]


def host_cost(curve: tuple[list[int], list[float]], width: int, per_depth: bool) -> float:
    """A drafter's time besides the forward for a step `width` wide (1 + its widest draft), from the
    times measured at other widths fitted by `monotone_fit` (`curve`: widths and times, any unit):
    linear between measured widths and beyond the widest along the last segment (flat with one). Below
    the narrowest it is that width's time, or, for a drafter that runs a model once per draft depth
    (`per_depth`: a draft model, EAGLE's head), that time in proportion to the depth: the optimistic
    side, which the controller's sizing, one step at a time, then measures."""
    widths, costs = curve
    if width < widths[0] and per_depth and widths[0] > 1:
        return costs[0] * (width - 1) / (widths[0] - 1)
    return interpolate(widths, costs, width, None)


def best_chain_depth(alpha: float, step_costs: Sequence[float]) -> int:
    """The chain length k in 1..len(step_costs) with the most tokens per second, E(k) / step_costs[k − 1]
    (a step drafting k tokens costs step_costs[k − 1], in any unit), each token accepted with probability
    `alpha`: E(k) = 1 + α + … + α^k, the pending token's included; the shortest of equals."""
    return best_length([alpha**j for j in range(1, len(step_costs) + 1)], step_costs, plain_cost=None)


def tree_tau_by_budget(
    tried: dict[int, tuple[float, int]], budgets: Iterable[int], evidence_rows: int
) -> dict[int, float]:
    """τ at each node budget of `budgets`, from τ and row steps measured at the budgets `tried`.

    A tree's first nodes are its likeliest, so τ is non-decreasing and concave in the budget, τ(0) = 1.
    A budget m measured at τ_m bounds any other n between τ_m and 1 + (τ_m − 1) n / m (the line from
    (0, 1) through m's point: a floor below m, a ceiling above it); what m says of n is the middle,
    1 + (τ_m − 1)(1 + n / m) / 2. Each budget's estimate is its own mean shrunk toward what the best
    measured other budget says of it, weighed as that one's row steps (at most `evidence_rows`): a
    budget run only on a few steps of a cold drafter (a Lookahead trie before it has seen a prompt,
    τ 1.0) is not judged on them. Taken as its own lower bound, such a measurement would keep a tree
    drafter at half its node budget for good, though the full budget runs faster once it is warm."""
    found = {}
    for n in budgets:
        own, rows = tried.get(n, (0.0, 0))
        others = [(r, m) for m, (_, r) in tried.items() if m != n]
        if not others:
            found[n] = own if rows else 1.0
            continue
        weight, m = max(others)
        weight = min(weight, evidence_rows)
        said = 1 + (tried[m][0] - 1) * (1 + n / m) / 2
        found[n] = (own * rows + said * weight) / (rows + weight) if rows + weight else own
    return found


def best_tree_budget(tau_by_budget: dict[int, float], step_costs: dict[int, float]) -> int:
    """The node budget among `step_costs` (budget -> a step's cost) with the most tokens per second by
    `tau_by_budget` (`tree_tau_by_budget`); the smallest of equals."""
    return max(step_costs, key=lambda n: (tau_by_budget[n] / step_costs[n], -n))


def best_case_speedup(depths: Iterable[int], plain_seconds: float, step_seconds: Callable[[int], float]) -> float:
    """A drafter's speed-up over plain steps if every draft token were accepted: 1 + k tokens for a
    step drafting k (`step_seconds(k)`, at its cheapest: a chain; a tree of k nodes reaches no deeper),
    at its best among `depths`."""
    return max((1 + k) * plain_seconds / step_seconds(k) for k in depths)


def segment_ends(widths: list[int], max_depth: int) -> list[int]:
    """The draft depths where (1 + k) / t(1 + k) can peak, t piecewise linear with corners at `widths`:
    on each linear piece a ratio of two linear functions is monotone, so its maximum over 1..max_depth
    lies at a piece's end (a measured width, less the pending token) or at 1 or `max_depth`."""
    return sorted({1, max_depth, *(w - 1 for w in widths if 2 <= w <= max_depth + 1)})
