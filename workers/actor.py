"""The generator as the driver names it to Ray: a class the driver can hold without importing torch.

A cold job's driver imports its own modules while Ray starts on the same cores (`pipeline.cluster`);
torch and transformers were most of that import, for a class only the actor runs. Ray pickles this
class by reference; the actor's process imports `workers.generator` as the actor is constructed, and
every call goes on to the `Generator` it holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from strategies.control.controller import Learned
    from workers.common.controller_stats import StatsKey
    from workers.common.spec import UnitResult, WorkerSpec, WorkUnit


class GeneratorActor:
    """`workers.generator.Generator`, method for method (see there)."""

    def __init__(self, spec: WorkerSpec, actor: str) -> None:
        from workers.generator import Generator  # the actor's process only: see the module's docstring

        self.generator = Generator(spec, actor)

    def ready(
        self, job_id: str | None = None, auto_dtype: str | None = None, measure_dtypes: bool = False
    ) -> dict[str, Any]:
        return self.generator.ready(job_id, auto_dtype, measure_dtypes)

    def controller_statistics(self) -> tuple[StatsKey, Learned] | None:
        return self.generator.controller_statistics()

    def progress(self) -> tuple[int, int]:
        return self.generator.progress()

    def run_unit(
        self, unit: WorkUnit, attempt: int, staged_url: str, log_url: str, error_rows: dict[int, str]
    ) -> UnitResult:
        return self.generator.run_unit(unit, attempt, staged_url, log_url, error_rows)

    def probe_rows(self, unit: WorkUnit, rows: list[int]) -> bool:
        return self.generator.probe_rows(unit, rows)
