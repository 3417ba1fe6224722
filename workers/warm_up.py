"""What an actor pays once at its start so that its first units do not: the target's kernels made ready,
the controller told what earlier jobs learned and what forwards cost on this device, the modules the
output path loads on first use, and, where `model.dtype=auto` chooses on CPU, a decode step timed in each dtype.

The bench times forwards as an actor does (`timed_forwards`), so that its controller starts as one.
"""

from __future__ import annotations

import statistics

import pyarrow as pa
import torch

from strategies.control.controller import AdaptiveController
from strategies.control.cost_model import FORWARD_SAMPLES
from strategies.runtime import linear
from strategies.runtime.runner import ModelRunner, synthetic_contexts
from workers.common.contract import OUTPUT_SCHEMA
from workers.common.controller_stats import StatsKey
from workers.common.output_formats import encode_part
from workers.common.spec import WorkerSpec

# The forwards an actor times before its first batch for its controller (`timed_forwards`): new tokens
# per row, as the cost bench's grid (a draft's verify is 1 + its nodes wide: 5 to 17 by the defaults),
# over this many cached tokens per row.
TIMED_WIDTHS = (1, 2, 4, 8, 16)
TIMED_CONTEXT = 64
# Plain steps timed per dtype where `model.dtype=auto` chooses float32 or bfloat16 on CPU (`decode_step_seconds`).
DTYPE_STEP_SAMPLES = 5


def device_identity(device: torch.device) -> str:
    """The device as step costs see it: the GPU's name, or the CPU threads torch decodes with."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"{device.type} ({torch.get_num_threads()} threads)"


def prepare_target(runner: ModelRunner, spec: WorkerSpec, plain_steps_only: bool = False) -> None:
    """The target's weights packed as `model.pack_weights` says, then compiled (`model.compile`) or its
    kernels built for the row counts a batch of `workers.batch_size` meets (`plain_steps_only`: for a
    plain step's alone, what `decode_step_seconds` times, where `model.dtype=auto` has yet to choose)."""
    linear.set_packing(spec.model.pack_weights)
    if spec.model.compile:
        runner.compile()
    else:
        runner.warm_up(spec.workers.batch_size, plain_steps_only)


def start_controller(spec: WorkerSpec, runner: ModelRunner, stats_key: StatsKey) -> AdaptiveController | None:
    """The actor's controller (None unless `strategy.adaptive`), warm-started from what earlier jobs on
    this target, device and dtype learned (`stats_key`), then told of forwards timed here."""
    if not spec.strategy.adaptive:
        return None
    controller = AdaptiveController()
    if stats_key in spec.controller_stats:
        controller.warm_start(spec.controller_stats[stats_key])
    # After the warm start: loading an earlier job's forward times replaces those of the same keys, and
    # these are this job's own, the freshest.
    controller.time_forwards(spec.workers.batch_size, timed_forwards(runner, spec.workers.batch_size))
    return controller


def timed_forwards(runner: ModelRunner, batch_size: int) -> dict[int, list[float]]:
    """The forwards a controller is told of before the first batch (`AdaptiveController.time_forwards`:
    an actor's, and the in-process bench's as an actor's): `FORWARD_SAMPLES` of each of `TIMED_WIDTHS`
    over `batch_size` rows of `TIMED_CONTEXT` cached tokens (fewer where the model's positions end
    sooner; none where they cannot hold the widest)."""
    context = min(TIMED_CONTEXT, runner.max_context - max(TIMED_WIDTHS))
    if context < 1:
        return {}
    contexts = synthetic_contexts(batch_size, context, runner.vocab_size)
    return runner.forward_seconds(contexts, TIMED_WIDTHS, FORWARD_SAMPLES)


def load_output_modules() -> None:
    """Load what building a part loads on first use (pyarrow imports pandas at its first array built from
    Python values): paid at start, and not by the first unit's part while the next batch decodes beside
    it, which the two threads' shared GIL would stall for as long."""
    encode_part(pa.table({name: [] for name in OUTPUT_SCHEMA.names}, schema=OUTPUT_SCHEMA), "parquet")


def decode_step_seconds(runner: ModelRunner, batch_size: int) -> float:
    """The median of `DTYPE_STEP_SAMPLES` plain steps' forwards (one new token per row) over `batch_size`
    rows of `TIMED_CONTEXT` cached tokens, with the kernels `prepare_target` chose: what `model.dtype=auto`
    compares float32 and bfloat16 by (`workers.common.dtype_choice`)."""
    context = max(1, min(TIMED_CONTEXT, runner.max_context - 1))
    contexts = synthetic_contexts(batch_size, context, runner.vocab_size)
    return statistics.median(runner.forward_seconds(contexts, (1,), DTYPE_STEP_SAMPLES)[1])
