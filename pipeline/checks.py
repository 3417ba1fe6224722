"""Checks of a job's values that types alone cannot express, run before anything is written.

Each bad value is refused with its key, what the key must be and the value given; all of a config's
problems are listed at once. Strategy options are checked beside the strategies
(`strategies.registry.problems`), with the same messages (`strategies.config_bounds.out_of_bounds`).
"""

from __future__ import annotations

import math

from pipeline.artifact_checks import artifact_problems
from pipeline.config import JobConfig
from pipeline.errors import JobError
from pipeline.format_checks import format_problems
from strategies import registry
from strategies.config_bounds import Bound, out_of_bounds
from strategies.constraints.formats import FormatError, canonical
from workers.common.model_kinds import missing_models
from workers.common.row_settings import BIAS_BOUND, INT64, PENALTY_BOUND, sets_controls
from workers.common.row_settings import SETTINGS as ROW_SETTINGS
from workers.common.sections import DTYPES, GenerationConfig

# Resources every actor asks for through their own keys (workers.num_cpus_per_actor, num_gpus_per_actor).
RAY_OWN_RESOURCES = ("CPU", "GPU")


def validate(config: JobConfig) -> None:
    """Refuse the job (`JobError`, listing every problem) when any value is out of its bounds or
    contradicts another."""
    g, o = config.generation, config.output
    problems = out_of_bounds(_bounds(config))
    if g.n > 1 and g.temperature == 0:
        problems.append(
            f"generation.n={g.n} samples at generation.temperature=0 would be {g.n} copies of one greedy "
            "completion: set generation.temperature > 0 to sample, or generation.n=1"
        )
    if o.top_logprobs > o.max_top_logprobs >= 0:
        problems.append(
            f"output.top_logprobs={o.top_logprobs} is above output.max_top_logprobs={o.max_top_logprobs}: every "
            f"generated token would store {o.top_logprobs} (token id, log-probability) pairs; ask for at most "
            f"{o.max_top_logprobs}, or raise output.max_top_logprobs"
        )
    unknown = sorted(set(config.input.params_columns) - set(ROW_SETTINGS))
    if unknown:
        problems.append(f"input.params_columns: {unknown} cannot be set per row; use any of {', '.join(ROW_SETTINGS)}")
    if config.model.dtype not in DTYPES:
        problems.append(f"model.dtype must be one of {', '.join(DTYPES)}, got {config.model.dtype!r}")
    for name in sorted(set(config.workers.custom_resources) & set(RAY_OWN_RESOURCES)):
        problems.append(
            f"workers.custom_resources.{name}: set workers.num_{name.lower()}s_per_actor instead (Ray takes "
            f"{', '.join(RAY_OWN_RESOURCES)} only through them)"
        )
    scores = o.logprobs or o.top_logprobs > 0
    controls, formats = sets_controls(g), _format_problems(g, problems)
    problems.extend(
        registry.problems(config.strategy, g.temperature == 0, logprobs=scores, controls=controls, formats=formats)
    )
    problems.extend(missing_models(config.strategy, config.model))
    problems.extend(artifact_problems(config))
    problems.extend(format_problems(config))
    if problems:
        raise JobError("invalid config:\n  " + "\n  ".join(problems))


def _format_problems(g: GenerationConfig, problems: list[str]) -> bool:
    """Whether the job asks for a response_format; a shape that cannot be one joins `problems`."""
    try:
        return g.response_format is not None and canonical(g.response_format) is not None
    except FormatError as exc:
        problems.append(f"generation.response_format: {exc}")
        return False


def _bounds(config: JobConfig) -> list[Bound]:
    """Every numeric key's bounds (a NaN or an infinity is out of them where the key needs a number)."""
    i, o, g, w, m = config.input, config.output, config.generation, config.workers, config.model
    return [
        ("input.rows_per_unit", i.rows_per_unit, i.rows_per_unit > 0, "> 0"),
        ("model.prefix_cache_mb", m.prefix_cache_mb, 0 <= m.prefix_cache_mb < math.inf, ">= 0 (0: no prefix cache)"),
        ("output.top_logprobs", o.top_logprobs, o.top_logprobs >= 0, ">= 0 (0: no top_logprobs column)"),
        ("output.max_top_logprobs", o.max_top_logprobs, o.max_top_logprobs >= 0, ">= 0"),
        ("generation.max_new_tokens", g.max_new_tokens, g.max_new_tokens > 0, "> 0"),
        ("generation.temperature", g.temperature, 0 <= g.temperature < math.inf, ">= 0 (0: greedy) and finite"),
        ("generation.top_p", g.top_p, 0 < g.top_p <= 1, "in (0, 1]"),
        ("generation.top_k", g.top_k, g.top_k >= 0, ">= 0 (0: no limit)"),
        ("generation.seed", g.seed, INT64[0] <= g.seed <= INT64[1], "a whole number that fits in 64 bits"),
        ("generation.n", g.n, g.n >= 1, ">= 1"),
        *_control_bounds(config),
        ("workers.num_actors", w.num_actors, w.num_actors >= 0, ">= 0 (0: one per GPU, or one CPU actor)"),
        ("workers.batch_size", w.batch_size, w.batch_size > 0, "> 0"),
        ("workers.max_batch_tokens", w.max_batch_tokens, w.max_batch_tokens > 0, "> 0"),
        ("workers.num_gpus_per_actor", w.num_gpus_per_actor, 0 <= w.num_gpus_per_actor < math.inf, ">= 0"),
        ("workers.num_cpus_per_actor", w.num_cpus_per_actor, 0 < w.num_cpus_per_actor < math.inf, "> 0"),
        ("workers.torch_threads", w.torch_threads, w.torch_threads >= 0, ">= 0 (0: the node's cores shared)"),
        ("workers.actor_start_timeout_s", w.actor_start_timeout_s, 0 < w.actor_start_timeout_s < math.inf, "> 0"),
        ("workers.max_unit_attempts", w.max_unit_attempts, w.max_unit_attempts > 0, "> 0"),
        ("workers.unit_timeout_s", w.unit_timeout_s, w.unit_timeout_s > 0, "> 0"),
        *(
            (f"workers.custom_resources.{name}", amount, 0 <= amount < math.inf, ">= 0")
            for name, amount in w.custom_resources.items()
        ),
    ]


def _control_bounds(config: JobConfig) -> list[Bound]:
    """The sampling controls' bounds (`workers.common.row_settings` checks a row's own values alike)."""
    g = config.generation
    penalty = f"in [-{PENALTY_BOUND:g}, {PENALTY_BOUND:g}] (0: none)"
    return [
        ("generation.presence_penalty", g.presence_penalty, abs(g.presence_penalty) <= PENALTY_BOUND, penalty),
        ("generation.frequency_penalty", g.frequency_penalty, abs(g.frequency_penalty) <= PENALTY_BOUND, penalty),
        ("generation.repetition_penalty", g.repetition_penalty, 0 < g.repetition_penalty < math.inf, "> 0 (1: none)"),
        ("generation.min_p", g.min_p, 0 <= g.min_p <= 1, "in [0, 1] (0: none)"),
        ("generation.min_tokens", g.min_tokens, g.min_tokens >= 0, ">= 0"),
        *((f"generation.stop_token_ids[{i}]", t, t >= 0, "a token id >= 0") for i, t in enumerate(g.stop_token_ids)),
        *(
            (f"generation.logit_bias.{token}", bias, str(token).isdigit() and abs(bias) <= BIAS_BOUND, _BIAS_NEED)
            for token, bias in g.logit_bias.items()
        ),
    ]


_BIAS_NEED = f"a bias in [-{BIAS_BOUND:g}, {BIAS_BOUND:g}] under a token id (a whole number >= 0)"
