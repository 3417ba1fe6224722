"""The driver's part in `model.dtype=auto` on CPU (`workers/common/dtype_choice.py`): one choice per job,
made before the job claims its output folder, since the job's identity holds it.
"""

from __future__ import annotations

from typing import Any, Protocol

from pipeline.phases import Phases
from workers.common.dtype_choice import choose_auto_dtype


class MeasuringPool(Protocol):
    """What the choice asks of the actor pool (`pipeline.actor_pool.ActorPool`), which imports this module."""

    measures_dtype: bool

    def choose_dtype(self) -> str: ...


def job_auto_dtype(pool: MeasuringPool | None, phases: Phases, recorded: str | None) -> str:
    """The dtype `model.dtype=auto` chose by measuring, for the job's identity: a resumed job's recorded
    one (`job_record.recorded_auto_dtype`), or a new job's once the pool's first actor has measured
    (`ActorPool.choose_dtype`); "" where none was measured. The wait for that actor is actor start."""
    if recorded is not None or pool is None or not pool.measures_dtype:
        return recorded or ""
    phases.lap("planning")
    chosen = pool.choose_dtype()
    phases.lap("actor_start")
    return chosen


def measured_choice(info: dict[str, Any]) -> str:
    """The job's dtype from the first actor's `ready()` after it measured (`Generator.ready`), printed;
    "" where it measured nothing (a CPU without bfloat16 matrix hardware: float32, as its device decides)."""
    seconds = info.get("dtype_seconds")
    if not seconds:
        return ""
    chosen = choose_auto_dtype(False, info["bf16_flags"], seconds)
    steps = ", ".join(f"{name} {1e3 * s:.1f} ms" for name, s in seconds.items())
    print(f"model.dtype=auto: {chosen} (a CPU with {', '.join(info['bf16_flags'])}; a decode step: {steps})")
    return chosen
