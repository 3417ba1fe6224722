"""What a controller keeps between steps, and the events it tells of its switches.

Statistics are kept per batch-size bucket (powers of two). Step times are kept per row: rows finish
unevenly under speculation, and a drafter's steps at the end of a batch run with fewer rows than the
bucket's plain steps, so whole step times would make it look cheaper than it is (per row, such a step
looks dearer where a step's cost hardly depends on its rows, as on a GPU: the safe side). A drafter's
times are kept as ratios to a plain step's at its bucket when it ran: a machine's speed drifts with what
else runs on it, and a drafter measured while it was loaded must not look slow, or fast, against plain
steps measured since.

Every switch is an event (scope, from, to, reason, estimates) that the worker logs (`drain_events`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from strategies.control.cost_model import ForwardCosts, RecentTime
from strategies.control.settings import ControllerSettings
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits, Plan


def bucket(batch_size: int) -> int:
    """Batch sizes share statistics within powers of two."""
    return 1 << max(0, batch_size - 1).bit_length()


@dataclass
class Ema:
    """A moving average that is a plain mean of its first measurements, until the moving weight is the
    larger: a first unlucky step must not stand for many steps."""

    value: float = 0.0
    seen: float = 0.0  # measurements so far, each counted by its share of a full weight

    def update(self, x: float, weight: float, share: float = 1.0) -> None:
        self.seen += share
        weight = max(weight, share / self.seen)
        self.value = (1 - weight) * self.value + weight * x


@dataclass
class RowDrafting:
    """What the controller keeps of one batch row: its drafts rejected in a row, and the step until which
    its drafting is off (`row_patience`, `row_cooldown`)."""

    streak: int = 0
    off_until: int = 0


@dataclass
class ControllerState:
    """Every field the controller's parts share, declared in one place: each part (`step_costs.py`,
    `sizing.py`, `estimates.py`, `exploration.py`, `observation.py`) adds methods over them."""

    settings: ControllerSettings = field(default_factory=ControllerSettings)

    def __post_init__(self) -> None:
        # (option, bucket) -> seconds per row-step of plain steps; a drafter's over a plain row-step's
        # when it ran (the machine's speed drifts: ratios hold, see `host_time`).
        self.row_time: dict[tuple[str, int], RecentTime] = {}
        self.tau: dict[str, Ema] = {}
        # drafter -> (bucket, node budget asked for) -> τ there: where it drafts at this batch size and size
        self.tau_at: dict[str, dict[tuple[int, int], Ema]] = {}
        self.depth: dict[str, int] = {}
        self.nodes: dict[str, int] = {}
        self.resize_tally: dict[tuple[str, int], list[int]] = {}  # (drafter, bucket) -> `_tally_drafts`
        self.measured: dict[str, tuple[int, int]] = {}  # option -> steps and row steps measured
        # Estimates by (what, option, bucket), until the next measurement: a plan asks for them many times.
        self.memo: dict[tuple[str, str, int], object] = {}
        self.limits: dict[str, DraftLimits] = {}
        self.current = AUTOREGRESSIVE  # the option chosen at the bucket planned last
        # bucket -> the option chosen there when another bucket was last planned (`_enter_bucket`)
        self.chosen_at: dict[int, str] = {}
        self.planned_bucket: int | None = None
        self.step = 0  # steps observed
        self.row_steps = 0  # row steps observed, of every option
        # A learning drafter -> the row steps its estimate rests on (`_evidence`), and `row_steps` then.
        self.evidence: dict[str, tuple[float, int]] = {}
        self.last_used: dict[str, int] = {}
        self.events: list[dict] = []
        self.failed: set[str] = set()
        self.rows: list[RowDrafting] = []  # per batch row, in batch order (`keep_rows`, `add_rows`)
        self.refilled = False  # whether rows joined the batch after its start (`add_rows`): `_step_gain`
        self.forward = ForwardCosts(self.settings.time_window)  # the target's forward by bucket and width
        # (drafter, bucket, width) -> step − forward, per row, over a plain step's time there when it ran
        # (as the cost model keeps wide forwards: the machine's speed drifts, ratios hold).
        self.host_time: dict[tuple[str, int, int], RecentTime] = {}
        # (drafter, bucket) -> a drafter that does not learn (`_learns`): what starting it took, per row over
        # a plain step's time, at each of its last steps after another option's (`_resume_cost`).
        self.resume_setup: dict[tuple[str, int], deque[float]] = {}
        # (chain drafter, bucket) -> its acceptance per position there, at its last resize at that bucket
        self.alpha: dict[tuple[str, int], float] = {}
        self.tree_tau: dict[str, dict[int, Ema]] = {}  # a tree drafter's τ by node budget asked for
        # (drafter, budget) -> the drafter's row steps measured (`measured`) when τ at that budget last moved
        self.tree_tau_at: dict[tuple[str, int], int] = {}
        self.planned_nodes: dict[str, int] = {}  # the node budget of each drafter's last plan
        self.drafted_width: dict[str, RecentTime] = {}  # a drafter's recent forward widths, drafting or not
        self.exploring: str | None = None  # a drafter planned for a step that explores it
        self.exploring_s = 0.0  # time of every such step
        self.exploring_lost_s = 0.0  # what they lost: time beyond plain steps emitting their tokens, drafters' starts
        self.decode_s = 0.0  # time of all steps
        self._drained = (0.0, 0.0, 0.0)  # (exploring_s, exploring_lost_s, decode_s) at the last `drain_exploring`
        # (drafter, bucket) -> step, basis and value (`_kept`) of `best_case` and `_step_costs`
        self.best_cases: dict[tuple[str, int], tuple[int, tuple, float]] = {}
        self.step_costs: dict[tuple[str, int], tuple[int, tuple, list[float]]] = {}
        self.hopeless: set[tuple[str, int]] = set()  # (drafter, bucket) whose best case loses, told in an event
        # (batch size, step, plan): the current drafter's plan stands until that step at that batch size
        self.standing: tuple[int, int, Plan] | None = None

    def _event(self, scope: str, source: str, target: str, reason: str, **details) -> None:
        self.events.append(
            {"scope": scope, "from": source, "to": target, "reason": reason, "step": self.step, **details}
        )

    def drain_events(self) -> list[dict]:
        events, self.events = self.events, []
        return events
