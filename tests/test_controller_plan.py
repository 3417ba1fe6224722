"""The controller's decision rule (`strategies/control/controller.py`'s `plan`, `_plan_for`) on a literal
script of what its parts answer: which options may pay, which are unexplored, exploring and probe waits,
estimates; each test names the mutants it kills."""

from __future__ import annotations

from strategies.control.controller import AdaptiveController, ControllerSettings
from strategies.control.state import bucket
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits, Plan

A, B = "a", "b"


class ScriptedParts(AdaptiveController):
    """A controller whose exploration, probes and estimates answer from literal tables, asked at the batch's
    bucket and size only: its decision rule is tested apart from them."""

    def __init__(self, drafters: dict[str, DraftLimits], batch_size: int = 1) -> None:
        super().__init__(ControllerSettings())
        self.start_batch(drafters, batch_size)
        self.step = 10
        self.size = batch_size
        self.speedups: dict[str, float] = {}
        self.hopeless: set[str] = set()
        self.unexplored: set[str] = set()
        self.explore_waits: dict[str, int] = {}
        self.probe_waits = dict.fromkeys((AUTOREGRESSIVE, *drafters), 100)
        self.cheapest: dict[str, float] = {}
        self.carded: dict[str, float] = {}

    def _asked(self, b: int) -> None:
        if b != bucket(self.size):
            raise AssertionError(f"asked at bucket {b} for a batch of {self.size}")

    def speedup(self, drafter: str, b: int) -> float | None:
        self._asked(b)
        return 1.0 if drafter == AUTOREGRESSIVE else self.speedups.get(drafter)

    def draft_size(self, drafter: str, b: int | None = None) -> tuple[int, int]:
        self._asked(b)
        return super().draft_size(drafter, b)

    def _may_pay(self, drafter: str, b: int) -> bool:
        self._asked(b)
        return drafter not in self.hopeless

    def _unexplored(self, option: str, b: int) -> bool:
        self._asked(b)
        return option in self.unexplored

    def _explore_wait(self, drafter: str, b: int, batch_size: int) -> int:
        self._asked(b)
        if batch_size != self.size:
            raise AssertionError(f"asked for a batch of {batch_size}, not {self.size}")
        return self.explore_waits.get(drafter, 0)

    def probe_wait(self, option: str, b: int) -> int:
        self._asked(b)
        return self.probe_waits[option]

    def _step_cost(self, drafter: str, b: int) -> float:
        self._asked(b)
        return self.cheapest.get(drafter, 0.0)

    def _card_speedup(self, drafter: str, b: int) -> float | None:
        self._asked(b)
        return self.carded.get(drafter)

    def _step_costs(self, drafter: str, b: int) -> list[float] | None:
        self._asked(b)
        return [1.5, 2.0] if self.limits[drafter].sizes_own else None


def _ran_all(c: ScriptedParts) -> None:
    for option in (AUTOREGRESSIVE, *c.limits):
        c.last_used[option] = c.step
        c.measured[option] = (100, 6400)


def test_plain_steps_are_explored_first_then_the_measured_and_cheapest_drafter():
    """Kills `plan` exploring a drafter before plain steps, ordering unexplored drafters other than those
    already measured first and then the cheapest step, exploring the first while it does not fit the budget,
    or not marking the step as exploring."""
    c = ScriptedParts({A: DraftLimits(4, 4), B: DraftLimits(3, 3)})
    c.unexplored = {AUTOREGRESSIVE, A, B}
    assert (c.plan(1), c.exploring) == (Plan(AUTOREGRESSIVE, 0, 0), None)
    c.unexplored = {A, B}
    c.cheapest = {A: 2.0, B: 1.0}
    assert (c.plan(1), c.exploring) == (Plan(B, 3, 3), B)
    c.measured[A] = (1, 1)
    assert (c.plan(1), c.exploring) == (Plan(A, 4, 4), A)
    c.explore_waits[A] = 5
    assert (c.plan(1), c.exploring) == (Plan(AUTOREGRESSIVE, 0, 0, steps=5), None)


def test_plain_steps_run_unasked_until_the_next_probe_or_exploration_at_least_one():
    """Kills `plan`'s plain steps other than the fewest of each explored drafter's probe wait less the steps
    since it ran (counting the next) and the first unexplored drafter's exploring wait (not the second's),
    at least 1; other than None where no drafter is offered; waits asked at another bucket or batch size."""
    c = ScriptedParts({A: DraftLimits(4, 4), B: DraftLimits(4, 4)})
    c.last_used = {AUTOREGRESSIVE: 10, A: 4}
    c.unexplored = {B}
    c.explore_waits = {B: 120}
    assert c.plan(1).steps == 93  # 100 - (10 + 1 - 4)
    c.explore_waits = {B: 50}
    assert c.plan(1).steps == 50
    c.unexplored, c.cheapest, c.explore_waits = {A, B}, {A: 1.0, B: 2.0}, {A: 120, B: 50}
    assert c.plan(1).steps == 120  # the first to explore only
    c.unexplored = set()
    c.last_used[B] = 9
    assert c.plan(1).steps == 93
    c.probe_waits[A] = 7
    assert c.plan(1) == Plan(A, 4, 4)  # due: its probe
    c.last_used[A] = 5
    assert c.plan(1).steps == 1  # 7 - 6
    alone = ScriptedParts({A: DraftLimits(4, 4)})
    alone.failed.add(A)
    alone.last_used[AUTOREGRESSIVE] = 10
    assert alone.plan(1).steps is None


def test_of_the_options_due_a_probe_the_one_that_ran_longest_ago_runs():
    """Kills `plan` probing other than the due option used longest ago (one never used as at step 0), one
    not due, the current one, or one still unexplored."""
    c = ScriptedParts({A: DraftLimits(4, 4), B: DraftLimits(3, 3)})
    c.last_used = {AUTOREGRESSIVE: 10, A: 1}
    c.probe_waits[A] = c.probe_waits[B] = 5
    assert c.plan(1) == Plan(B, 3, 3)
    c.last_used[B] = 2
    assert c.plan(1) == Plan(A, 4, 4)
    c.probe_waits[A] = 11
    assert c.plan(1) == Plan(B, 3, 3)
    c.unexplored, c.explore_waits = {B}, {B: 40}
    assert c.plan(1) == Plan(AUTOREGRESSIVE, 0, 0, steps=1)  # A's probe is due at the next step


def test_a_chosen_drafters_plan_stands_for_replan_rows_at_its_batch_size():
    """Kills `plan` keeping a drafter's plan other than `replan_rows` // batch size steps, at another batch
    size, without the rows now off, or keeping a plain plan; `_plan_for` other than the drafter's sizes."""
    c = ScriptedParts({A: DraftLimits(4, 4), B: DraftLimits(4, 4)}, batch_size=3)
    c.speedups = {A: 1.5}
    _ran_all(c)
    plan = c.plan(3)
    assert plan == Plan(A, 4, 4)
    assert c.standing == (3, 12, plan)
    assert c.drain_events()[0]["to"] == A
    c.step, c.speedups = 11, {A: 0.5}
    c.rows[1].off_until = 20
    assert c.plan(3) == Plan(A, 4, 4, rows_off={1})  # standing: not weighed again
    c.step = 12
    assert c.plan(3) == Plan(AUTOREGRESSIVE, 0, 0, steps=97)  # probes of A and B in 100 - 3 steps
    assert c.standing is None
    c.speedups, c.last_used[A] = {A: 1.5}, 12
    assert c.plan(3) == Plan(A, 4, 4, rows_off={1})
    c.step, c.speedups, c.size = 13, {A: 0.5}, 2
    assert c.plan(2).drafter == AUTOREGRESSIVE  # another batch size: weighed again


def test_a_current_drafter_whose_best_case_loses_gives_way_to_plain_steps_and_says_so():
    """Kills `plan` keeping a current drafter that may not pay or failed, or its event's scope, source,
    target, reason or bucket."""
    c = ScriptedParts({A: DraftLimits(4, 4)}, batch_size=3)
    _ran_all(c)
    c.current, c.hopeless = A, {A}
    assert c.plan(3).drafter == AUTOREGRESSIVE
    assert c.drain_events() == [
        {
            "scope": "batch",
            "from": A,
            "to": AUTOREGRESSIVE,
            "reason": "its best case loses to plain steps",
            "step": 10,
            "batch_bucket": 4,
        }
    ]


def test_an_option_known_only_from_loaded_statistics_runs_before_any_choice():
    """Kills `plan` not running the best unconfirmed estimate at once, or choosing before it."""
    c = ScriptedParts({A: DraftLimits(4, 4), B: DraftLimits(3, 3)})
    c.last_used = {AUTOREGRESSIVE: 10, A: 10}
    c.measured = {A: (100, 6400), B: (100, 6400)}
    c.speedups = {A: 1.2, B: 1.6}
    assert c.plan(1) == Plan(B, 3, 3)
    assert (c.current, c.drain_events()) == (AUTOREGRESSIVE, [])


def test_a_drafter_that_sizes_its_own_drafts_is_planned_at_its_limits_with_its_step_costs():
    """Kills `_plan_for` planning a drafter that sizes its own drafts at its learned size or without its
    step costs, recording other than the planned node budget, or the rows off."""
    c = ScriptedParts({A: DraftLimits(6, 24, trees=True, sizes_own=True), B: DraftLimits(4, 4)}, batch_size=2)
    c.nodes[A] = 8
    c.rows[0].off_until = 20
    assert c._plan_for(A, 2) == Plan(A, 6, 24, rows_off={0}, step_costs=[1.5, 2.0])
    assert c._plan_for(B, 2) == Plan(B, 4, 4, rows_off={0})
    assert c.planned_nodes == {A: 8, B: 4}
    assert (c._plan_for(A, 2, exploring=True).drafter, c.exploring) == (A, A)
    assert (c._plan_for(AUTOREGRESSIVE, 2), c.exploring) == (Plan(AUTOREGRESSIVE, 0, 0), None)


def test_a_drafter_whose_exploration_ended_on_the_step_just_taken_is_chosen_before_the_next_explores():
    """Kills `plan` weighing the options only when nothing is to be explored: a drafter whose last exploring
    step was the step just taken (fresh evidence, `_choose`) would be chosen only at its next probe, and
    plain steps would run while the budget refills for the next drafter to explore."""
    c = ScriptedParts({A: DraftLimits(4, 4), B: DraftLimits(3, 3)})
    c.unexplored = {B}
    c.speedups = {A: 2.0}
    c.last_used[A] = c.step
    assert (c.plan(1), c.exploring) == (Plan(B, 3, 3), B)
    assert c.current == A
    c.explore_waits[B] = 5
    assert (c.plan(1), c.exploring) == (Plan(A, 4, 4), None)  # while the budget refills: the drafter that pays


def test_of_the_drafters_whose_exploration_has_begun_the_most_promising_is_explored_first():
    """Kills `_explore_rank` ordering drafters whose exploration has begun by their step's cost rather than
    by their estimates raised by their spread, or putting one not yet run before them: a drafter whose first
    step drafted deep and was accepted is explored in full, and can be chosen, before others."""
    c = ScriptedParts({A: DraftLimits(4, 4), B: DraftLimits(3, 3), "c": DraftLimits(2, 2)})
    c.unexplored = {A, B, "c"}
    c.cheapest = {A: 1.0, B: 2.0, "c": 0.5}
    c.measured[A] = c.measured[B] = (1, 1)
    c.speedups = {A: 1.2, B: 3.0}
    assert (c.plan(1), c.exploring) == (Plan(B, 3, 3), B)
    c.speedups[B] = 1.1
    assert (c.plan(1), c.exploring) == (Plan(A, 4, 4), A)


def test_of_the_drafters_not_yet_run_those_their_cards_say_pay_go_first_the_most_promising_first():
    """Kills `_explore_rank` ordering drafters not yet run by their step's cost alone, ranking those whose
    card says they would pay by the card's speed-up ascending, putting them before a drafter whose
    exploration has begun, or ranking one whose card's speed-up does not beat plain steps by the hysteresis
    (1.05) among them rather than cheapest first with the drafters without a card."""
    c = ScriptedParts({A: DraftLimits(4, 4), B: DraftLimits(3, 3), "c": DraftLimits(2, 2), "d": DraftLimits(5, 5)})
    c.unexplored = {A, B, "c", "d"}
    c.cheapest = {A: 1.0, B: 2.0, "c": 3.0, "d": 0.5}
    c.carded = {B: 1.5, "c": 2.5, "d": 1.05}
    assert (c.plan(1), c.exploring) == (Plan("c", 2, 2), "c")
    c.unexplored.discard("c")
    assert (c.plan(1), c.exploring) == (Plan(B, 3, 3), B)
    c.unexplored.discard(B)
    assert (c.plan(1), c.exploring) == (Plan("d", 5, 5), "d")  # 1.05 does not pay: cheapest first
    c.measured[A] = (1, 1)
    c.speedups[A] = 1.0
    c.unexplored = {A, "c"}
    assert (c.plan(1), c.exploring) == (Plan(A, 4, 4), A)  # begun first
