"""A step for users who already have a Ray Data pipeline: prompts in, the job's output columns out.

    ds = ray.data.read_parquet("s3://bucket/prompts/")
    out = ds.map_batches(
        GenerateBatches,
        fn_constructor_kwargs={"overrides": ["input.id_column=id", "strategy.name=auto"]},
        compute=ray.data.ActorPoolStrategy(size=4),
        batch_format="pyarrow",
        batch_size=256,
        num_gpus=1,
    )
    out.write_parquet("s3://bucket/completions/")

Each actor of the pool holds one `workers.generator.Generator`, the very one the CLI's actors hold:
the same model loading, row checks, chat rendering, strategies and adaptive controller, and the same
output columns. What it does not do is the CLI's: no work units, no staging, no commit records,
no manifest and no resume; Ray Data owns scheduling and writing, with its own retry semantics. For
exactly-once output, run `accelgen generate`.
"""

from __future__ import annotations

import pyarrow as pa

from jobs.shipped import default_job_config
from pipeline.checks import validate
from pipeline.config import JobConfig, load_config
from pipeline.driver import worker_spec
from pipeline.errors import JobError
from workers.common.spec import WorkUnit
from workers.generator import Generator
from workers.output_part import output_schema

# The Dataset is the input and the pipeline writes the output: these keys are not read on this path.
UNUSED_URL = "(the Ray Data Dataset)"
JOB_ID = "ray-data"


def ray_data_config(yaml_path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> JobConfig:
    """The job config of the Ray Data step: the CLI's schema, defaults and checks; `input.id_column` required.

    Rows of a Dataset have no shard path and index to derive an id from, and a row's sampling draws
    are keyed by its id, so the id must come from a column for a row's output not to depend on its batch.
    """
    base = default_job_config()
    base.input.url = base.output.url = UNUSED_URL
    config = load_config(base, yaml_path, list(overrides))
    validate(config)
    if not config.input.id_column:
        raise JobError(
            "input.id_column is required on the Ray Data path: name a column of unique row ids "
            "(e.g. overrides=['input.id_column=id']); a Dataset's rows have no shard and index to derive one from"
        )
    return config


class GenerateBatches:
    """A callable class for `Dataset.map_batches(..., batch_format="pyarrow")`: loads the models once per
    actor, then turns each batch of prompt rows into the job's output rows (`generation.n` per input row,
    bad rows as error rows). Constructor: `config` (a YAML path, as `accelgen generate` takes) and `overrides`
    (`key=value` strings, the CLI's keys). The batch records the CLI writes to `_logs/` are not kept."""

    def __init__(self, config: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> None:
        self.spec = worker_spec(ray_data_config(config, overrides), JOB_ID)
        self.generator = Generator(self.spec)
        self.wanted = [
            self.spec.input.messages_column or self.spec.input.prompt_column,
            self.spec.input.id_column,
            *([self.spec.input.strategy_column] if self.spec.input.strategy_column else []),
            *self.spec.input.params_columns.values(),
            *self.spec.input.keep_columns,
        ]

    def __call__(self, batch: pa.Table) -> pa.Table:
        if not isinstance(batch, pa.Table):
            raise TypeError(
                f"GenerateBatches takes pyarrow batches: pass batch_format='pyarrow' to map_batches "
                f"(got {type(batch).__name__})"
            )
        missing = [c for c in self.wanted if c not in batch.column_names]
        if missing:
            raise JobError(f"columns {missing} are not in the Dataset (its columns: {', '.join(batch.column_names)})")
        unit = WorkUnit(JOB_ID, "", "", (), 0, batch.num_rows)  # ids come from the id column, not from it
        columns = self.generator.decode_table(batch, unit, attempt=1, error_rows={}).columns
        return pa.table(columns, schema=output_schema(self.spec, batch))
