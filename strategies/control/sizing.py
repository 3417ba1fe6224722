"""How long a drafter's drafts are: sized per batch for the most tokens per second.

Where the cost model covers the plan's bucket, a chain's length k maximises E(k) / t(k), E from the
acceptance per position α measured over the last `resize_rows` drafted row steps at that bucket (or the
nearest one measured) and t(k) the modelled step at width 1 + k; a tree's budget is the best of the
configured one (an upper bound), the learned one and their halvings by τ(n) / t(n), τ kept per budget
asked for, each leaning on what the others say of it while it rests on few or old row steps
(`cost_model.tree_tau_by_budget`, `_tree_evidence`). Configured sizes are bounds: the cost model
chooses within them for the batch at hand, and a strategy without the controller
(`strategy.adaptive=false`) drafts what is configured.

The learned sizes (`_resize`) move as before, and size drafts where the model does not cover the
bucket: chains one token at a time toward the best length (by the model's costs, else a draft token's
measured cost c in plain steps, E(k) / (1 + c·k)); trees double their node budget (up to the
strategy's) while a node yields at least twice what it costs (accepted tokens per node against the
measured cost of a node, both in plain steps) and halve it while it yields less than it costs.
"""

from __future__ import annotations

from strategies.control.cost_model import best_chain_depth, best_tree_budget, tree_tau_by_budget
from strategies.control.state import Ema
from strategies.control.step_costs import StepCosts
from strategies.verification.control import StepRecord


class DraftSizing(StepCosts):
    """The (depth, nodes) each drafter is asked for, and how what its steps accepted moves them."""

    def draft_size(self, drafter: str, b: int | None = None) -> tuple[int, int]:
        """The (depth, nodes) the next step of `drafter` asks for, within its limits. Where the cost model
        covers bucket `b`: the most tokens per second there, a chain's length from its acceptance per
        position (E(k) against the step's cost at width 1 + k), a tree's budget (at most the configured
        one) from τ by budget (`tree_tau_by_budget`). Otherwise the size learned by `_resize`."""
        if b is None or not self.forward.covers(b):
            return self.depth[drafter], self.nodes[drafter]
        if ("size", drafter, b) not in self.memo:
            self.memo[("size", drafter, b)] = self._modelled_size(drafter, b)
        return self.memo[("size", drafter, b)]

    def _modelled_size(self, drafter: str, b: int) -> tuple[int, int]:
        depth, nodes = self.depth[drafter], self.nodes[drafter]
        limits = self.limits[drafter]
        if limits.trees:
            s = self.settings
            # Row steps behind each budget's τ: an `Ema` counts a step of r rows as r / smoothing_rows.
            tried = {
                n: (ema.value, self._tree_evidence(drafter, n, ema) * s.smoothing_rows)
                for n, ema in self.tree_tau.get(drafter, {}).items()
            }
            smallest = min(s.min_tree_nodes, limits.max_nodes)
            # The configured budget is a bound, not a setting: it and its halvings are weighed beside the
            # learned budget and its halvings, so a tree grows back where the verify forward is flat.
            budgets = sorted(
                {n >> h for n in (nodes, limits.max_nodes) for h in range(n.bit_length()) if n >> h >= smallest}
            )
            if not tried or not budgets:
                return depth, nodes
            costs = {n: self._step_row_s(drafter, b, 1 + n) for n in budgets}
            return depth, best_tree_budget(tree_tau_by_budget(tried, budgets, s.evidence_rows), costs)
        alpha = self._alpha(drafter, b)
        if alpha is None or limits.sizes_own:
            return depth, nodes
        costs = [self._step_row_s(drafter, b, 1 + k) for k in range(1, limits.max_depth + 1)]
        best = best_chain_depth(alpha, costs)
        return best, best

    def _alpha(self, drafter: str, b: int) -> float | None:
        """A chain drafter's acceptance per position at bucket `b`, or at the nearest bucket where it was
        measured (the larger of two as near); None: not yet. Kept per bucket: the rows of a large batch are
        other prompts than those of batch 1, and a drafter's luck on them is theirs."""
        measured = [m for (name, m) in self.alpha if name == drafter]
        if not measured:
            return None
        nearest = min(measured, key=lambda m: (abs(m.bit_length() - b.bit_length()), -m))
        return self.alpha[(drafter, nearest)]

    def _tree_evidence(self, drafter: str, budget: int, ema: Ema) -> float:
        """What τ of tree drafter `drafter` at node budget `budget` has seen (`Ema.seen`), halved every
        `tree_half_life_rows` row steps the drafter ran at other budgets since: a learning drafter's τ
        moves (a Lookahead trie fills), and a budget last measured while it was cold must be measured
        again (`cost_model.tree_tau_by_budget` then leans on what the others say of it)."""
        since = self.measured.get(drafter, (0, 0))[1] - self.tree_tau_at.get((drafter, budget), 0)
        return ema.seen * 0.5 ** (since / self.settings.tree_half_life_rows)

    def _tally_drafts(self, record: StepRecord, b: int) -> tuple[int, int, int, int] | None:
        """Add the step's drafted rows to its drafter's tally at bucket `b`; the tally of the last `resize_rows`
        drafted row steps there once it has them (one step at batch 1 is one row's luck), to size drafts on, else None:
        (row steps, tokens drafted, tokens accepted, rows with a rejection)."""
        tally = self.resize_tally.setdefault((record.drafter, b), [0, 0, 0, 0])
        for drafted, accepted in zip(record.drafted, record.accepted, strict=True):
            if drafted:
                tally[0] += 1
                tally[1] += drafted
                tally[2] += accepted
                tally[3] += accepted < drafted
        if tally[0] < self.settings.resize_rows:
            return None
        self.resize_tally[(record.drafter, b)] = [0, 0, 0, 0]
        row_steps, drafted, accepted, rejections = tally
        return row_steps, drafted, accepted, rejections

    def _resize(self, name: str, b: int, tally: tuple[int, int, int, int], ratio: float | None) -> None:
        """Move the learned size of drafter `name` on `tally` (`_tally_drafts`), at bucket `b` where a step
        of it costs `ratio` plain steps (`cost_ratio`; None: unknown)."""
        row_steps, drafted, accepted, rejections = tally
        limits = self.limits[name]
        nodes = self.nodes[name]  # a chain's nodes are its depth
        node_cost = max(0.0, (ratio - 1) / nodes) if ratio is not None else 0.0  # in plain steps
        if limits.trees:  # double or halve on what a node yields against what it costs
            yield_per_node = accepted / drafted  # accepted tokens, each a plain step saved
            # The nodes a change adds or drops are the tree's least likely: twice the cost to grow.
            if yield_per_node >= 2 * node_cost:
                self.nodes[name] = min(limits.max_nodes, nodes * 2)
            elif yield_per_node < node_cost:
                self.nodes[name] = max(min(self.settings.min_tree_nodes, limits.max_nodes), nodes // 2)
            return
        if limits.sizes_own:  # its usual draft length, which its costing assumes (`draft_size`)
            self.depth[name] = self.nodes[name] = min(limits.max_depth, max(1, round(drafted / row_steps)))
            return
        # A chain: one step toward the depth with the most tokens per unit of step cost.
        depth = self.depth[name]
        self.alpha[(name, b)] = accepted / (accepted + rejections)
        costs = [self._step_row_s(name, b, 1 + k) or 1 + node_cost * k for k in range(1, limits.max_depth + 1)]
        best = best_chain_depth(self.alpha[(name, b)], costs)
        self.depth[name] = depth + (best > depth) - (best < depth)
        self.nodes[name] = self.depth[name]
