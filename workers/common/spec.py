"""What the driver hands an actor: the job's worker settings once, then one work unit at a time."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from strategies.control.controller import Learned
from strategies.options import StrategyOptions
from workers.common.controller_stats import StatsKey
from workers.common.sections import GenerationConfig, InputConfig, ModelConfig, OutputConfig, WorkersConfig


@dataclass(frozen=True)
class WorkUnit:
    """A shard, or a run of its row groups or lines: the unit of scheduling, retry and commit."""

    unit_id: str  # deterministic from the input listing (never from row content)
    shard_url: str  # where to read it (fsspec URL or path)
    shard_name: str  # path relative to the input root; derived row ids start from it
    row_groups: tuple[int, ...]
    first_row: int  # index within the shard of the unit's first row (JSON Lines: its line index)
    num_rows: int
    input_format: str = "parquet"  # or a JSON Lines format (`workers/common/json_lines.py`)
    byte_range: tuple[int, int] | None = None  # JSON Lines: the bytes holding its lines (None: the whole file)


@dataclass(frozen=True)
class WorkerSpec:
    """Everything an actor needs to decode any unit of the job: the job's sections an actor reads, as
    the config holds them (copies: the driver's config is not shared), and what the driver learned
    before the actors start. Holds credentials (storage options): never log it."""

    job_id: str
    model: ModelConfig
    input: InputConfig
    output: OutputConfig
    generation: GenerationConfig
    workers: WorkersConfig
    strategy: StrategyOptions
    # The optional models the job uses, by kind (`workers/common/model_kinds.py`): kind -> URL.
    models: dict[str, str] = field(default_factory=dict)
    # The target's weights hash: with the actor's device and dtype, the key of its controller statistics.
    target_sha256: str = ""
    # Controller statistics the driver read (workers.controller_stats_url, else the output's _logs/): each
    # actor warm-starts from its own key's entry, if any.
    controller_stats: dict[StatsKey, Learned] = field(default_factory=dict)
    # `model.dtype=auto` on CPU: the dtype a resumed job recorded (`workers.common.dtype_choice`); "": none
    # yet, float32 until the driver hands the job's choice to `Generator.ready`.
    auto_dtype: str = ""

    @property
    def scores(self) -> int | None:
        """What the strategies score (`GenerationParams.logprobs`): None unless a log-probability column is asked."""
        out = self.output
        return out.top_logprobs if out.logprobs or out.top_logprobs else None


def add_up(counts: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Named counts (tokens by strategy, seconds by kind, …) summed name by name, in first-seen order."""
    total: dict[str, float] = {}
    for named in counts:
        for name, n in named.items():
            total[name] = total.get(name, 0) + n
    return total


def tally_faults(tallies: Iterable[dict[str, tuple[int, str]]]) -> dict[str, tuple[int, str]]:
    """Per drafter: (faults, the first fault's message), summed over `tallies` in order. A batch
    record's tally is `{drafter: (len(messages), messages[0])}` of its `faults`."""
    total: dict[str, tuple[int, str]] = {}
    for tally in tallies:
        for drafter, (count, first) in tally.items():
            before, message = total.get(drafter, (0, first))
            total[drafter] = (before + count, message)
    return total


class UnitInputError(Exception):
    """The unit's input data cannot be read: retrying will not help until the file is fixed."""


@dataclass
class UnitResult:
    """What an attempt of a unit staged, for the driver to commit."""

    unit_id: str
    attempt: int
    staged_url: str
    num_rows: int
    num_errors: int
    sha256: str
    num_bytes: int
    prompt_tokens: int
    generated_tokens: int
    wall_s: float
    actor: str
    device: str
    tokens_by_strategy: dict[str, int] = field(default_factory=dict)
    tokens_by_option: dict[str, int] = field(default_factory=dict)  # drafting rows: tokens per drafter
    # Per drafter: (faults in the unit's batch records, the first one's message); see `tally_faults`.
    drafter_faults: dict[str, tuple[int, str]] = field(default_factory=dict)
    # When the earliest throughput record it logged closed (epoch seconds; None: it logged none). The
    # job's first batch ends at the earliest over all units, whichever unit's log took that record.
    first_record_end: float | None = None
    # The adaptive controller's seconds in its batch records (`AdaptiveController.drain_exploring`), summed.
    exploring: dict[str, float] = field(default_factory=dict)
