"""What the driver hands an actor: the job's worker settings once, then one work unit at a time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from strategies.options import StrategyOptions
from workers.controller import Learned
from workers.controller_stats import StatsKey


@dataclass(frozen=True)
class WorkUnit:
    """A shard, or a run of its row groups: the unit of scheduling, retry and commit."""

    unit_id: str  # deterministic from the input listing (never from row content)
    shard_url: str  # where to read it (fsspec URL or path)
    shard_name: str  # path relative to the input root; derived row ids start from it
    row_groups: tuple[int, ...]
    first_row: int  # index within the shard of the unit's first row
    num_rows: int


@dataclass(frozen=True)
class WorkerSpec:
    """Everything an actor needs to decode any unit of the job. Holds credentials: never log it."""

    job_id: str
    model_target: str
    dtype: str
    trust_remote_code: bool
    cache_dir: str
    strategy: StrategyOptions
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop: tuple[str, ...]
    seed: int
    ignore_eos: bool
    prompt_column: str
    id_column: str | None
    keep_columns: tuple[str, ...]
    strategy_column: str | None
    batch_size: int
    max_batch_tokens: int
    torch_threads: int
    input_storage_options: dict[str, Any] = field(default_factory=dict)
    output_storage_options: dict[str, Any] = field(default_factory=dict)
    model_storage_options: dict[str, Any] = field(default_factory=dict)
    # The optional models the job uses, by kind (`workers/model_kinds.py`): kind -> URL.
    models: dict[str, str] = field(default_factory=dict)
    model_compile: bool = False  # model.compile
    logprobs: bool = False  # output.logprobs
    top_logprobs: int = 0  # output.top_logprobs
    token_ids: bool = False  # output.token_ids
    params_columns: dict[str, str] = field(default_factory=dict)  # input.params_columns: setting -> column
    n: int = 1  # generation.n: samples per input row
    # The target's weights hash: with the actor's device and dtype, the key of its controller statistics.
    target_sha256: str = ""
    # Controller statistics the driver read (workers.controller_stats_url, else the output's _logs/): each
    # actor warm-starts from its own key's entry, if any.
    controller_stats: dict[StatsKey, Learned] = field(default_factory=dict)

    @property
    def scores(self) -> int | None:
        """What the strategies score (`GenerationParams.logprobs`): None unless a log-probability column is asked."""
        return self.top_logprobs if self.logprobs or self.top_logprobs else None

    messages_column: str | None = None  # set: prompts are chat messages rendered by the chat template


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
    # Per drafter: (faults in the unit's batch records, the first one's message); see `metrics.tally_faults`.
    drafter_faults: dict[str, tuple[int, str]] = field(default_factory=dict)
    # When the earliest throughput record it logged closed (epoch seconds; None: it logged none). The
    # job's first batch ends at the earliest over all units, whichever unit's log took that record.
    first_record_end: float | None = None
