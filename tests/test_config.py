"""The typed job config: YAML plus overrides, clear errors, and --help documenting every key."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import pytest

from jobs.args import config_or_usage
from jobs.cli import main
from jobs.shipped import default_job_config
from pipeline.checks import validate
from pipeline.config import JobConfig, describe, load_config, to_plain_dict
from pipeline.driver import run_job
from pipeline.errors import JobError

REQUIRED = ["input.url=in", "output.url=out"]


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("input:\n  url: a.parquet\noutput:\n  url: o\ngeneration:\n  max_new_tokens: 7\n  stop: ['x']\n")
    config = load_config(default_job_config(), str(path), ["generation.max_new_tokens=9", "workers.batch_size=3"])
    assert isinstance(config, JobConfig)
    assert config.generation.max_new_tokens == 9 and config.generation.stop == ["x"]
    assert config.workers.batch_size == 3 and config.input.url == "a.parquet"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["generation.max_tokens=3"], "generation.max_tokens"),
        (["workers.batch_size=many"], "workers.batch_size"),
        (["strategy.nme=x"], "strategy.nme"),
        (["generation.max_new_tokens"], "key=value"),
    ],
)
def test_bad_overrides_name_the_key(overrides, message):
    with pytest.raises(JobError, match=message):
        load_config(default_job_config(), None, [*REQUIRED, *overrides])


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [
        ("generation.max_tokens=3", "generation.max_new_tokens"),
        ("generaton.max_new_tokens=3", "generation.max_new_tokens"),  # a misspelt section
        ("strategy.lookahead.mod=tree", "strategy.lookahead.mode"),  # nested
        ("generation.temp=0.5", "generation.temperature"),  # an abbreviation
        ("workers.batch=3", "workers.batch_size"),
    ],
)
def test_misspelt_keys_name_the_nearest_valid_key(override, suggestion):
    with pytest.raises(
        JobError, match=rf"unknown config key '{override.split('=')[0]}': did you mean `{suggestion}`\?$"
    ):
        load_config(default_job_config(), None, [*REQUIRED, override])


def test_every_misspelt_yaml_key_is_named_at_once(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "generation:\n  max_tokens: 3\nstrategy:\n  lookahead:\n    mod: tree\n"
        "input:\n  storage_options:\n    anon: true\n"
    )
    with pytest.raises(JobError) as raised:
        load_config(default_job_config(), str(path), REQUIRED)
    message = str(raised.value)
    assert message.startswith(str(path)) and "storage_options" not in message  # free-form dicts take any key
    assert "did you mean `generation.max_new_tokens`?" in message
    assert "did you mean `strategy.lookahead.mode`?" in message
    with pytest.raises(JobError, match=r"unknown config key 'zzz' \(--help lists every key\)"):
        load_config(default_job_config(), None, [*REQUIRED, "zzz=1"])


def test_missing_required_keys_are_listed():
    with pytest.raises(JobError, match=r"input\.url.*output\.url|output\.url.*input\.url"):
        load_config(default_job_config(), None, [])


def test_missing_yaml_is_an_error():
    with pytest.raises(JobError, match="does not exist"):
        load_config(default_job_config(), "/nonexistent/job.yaml", [])


def test_help_documents_every_key_with_its_default(capsys):
    assert main(["generate", "--help"]) == 0
    printed = capsys.readouterr().out
    rows = describe(default_job_config())
    assert len(rows) > 25
    for key, default, help_text in rows:
        assert key in printed and help_text and f"default: {default}" in printed


def test_every_config_command_prints_its_usage_and_keys_on_help_and_reads_a_yaml_then_overrides(tmp_path, capsys):
    assert main(["bench", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: accelgen bench [CONFIG.yaml] [key=value ...]\n\nkeys:\n")
    assert main(["calibrate", "calm", "-h"]) == 0 and main(["calibrate"]) == 2
    usages = capsys.readouterr().out.split("usage: accelgen calibrate calm [CONFIG.yaml] [key=value ...]\n\nkeys:\n")
    assert len(usages) == 3 and not usages[0] and all("measures" in keys for keys in usages[1:])
    path = tmp_path / "job.yaml"
    path.write_text("generation:\n  max_new_tokens: 7\n")
    config = config_or_usage("usage", default_job_config(), [str(path), "workers.batch_size=3", *REQUIRED])
    assert config is not None and (config.generation.max_new_tokens, config.workers.batch_size) == (7, 3)


def test_storage_options_are_redacted():
    config = load_config(default_job_config(), None, [*REQUIRED, "input.storage_options.secret=s3cr3t"])
    plain = to_plain_dict(config)
    assert "s3cr3t" not in str(plain) and plain["input"]["storage_options"] == {"secret": "<redacted>"}


def test_cli_reports_job_errors_with_status_2(capsys):
    assert main(["generate", "input.url=/nonexistent", "output.url=/tmp/x", "strategy.name=nope"]) == 2
    err = capsys.readouterr().err
    assert "strategy.name 'nope' is unknown; available: auto, autoregressive, blockwise" in err


def _numeric_keys(config: object, prefix: str = "") -> Iterator[tuple[str, int | float]]:
    """Every int or float key of a config dataclass, with its default."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            yield from _numeric_keys(value, f"{prefix}{f.name}.")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield f"{prefix}{f.name}", value


def test_the_defaults_pass_the_checks():
    validate(load_config(default_job_config(), None, REQUIRED))


# Keys whose negative values mean something: the seed, and penalties that favour repeats (OpenAI's [-2, 2]).
SIGNED_KEYS = ("generation.seed", "generation.presence_penalty", "generation.frequency_penalty")


@pytest.mark.parametrize(
    ("key", "default"), [kd for kd in _numeric_keys(default_job_config()) if kd[0] not in SIGNED_KEYS]
)
def test_every_numeric_key_refuses_a_negative_value_and_a_float_one_nan(key, default):
    """No numeric key but the seed and the penalties takes a negative value: a new key without bounds
    fails here."""
    for bad in ["-1", *(["nan"] if isinstance(default, float) else [])]:
        with pytest.raises(JobError, match=rf"{re.escape(key)}[ =].*{bad}"):
            validate(load_config(default_job_config(), None, [*REQUIRED, f"{key}={bad}"]))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "output.top_logprobs=100000",
            "output.top_logprobs=100000 is above output.max_top_logprobs=20: every generated token would store "
            "100000 (token id, log-probability) pairs; ask for at most 20, or raise output.max_top_logprobs",
        ),
        ("generation.seed=18446744073709551616", "generation.seed must be a whole number that fits in 64 bits"),
        ("generation.temperature=inf", "generation.temperature must be >= 0 (0: greedy) and finite, got inf"),
        ("generation.top_p=1.5", "generation.top_p must be in (0, 1], got 1.5"),
        ("generation.n=3", "generation.n=3 samples at generation.temperature=0 would be 3 copies"),
        ("workers.num_cpus_per_actor=0", "workers.num_cpus_per_actor must be > 0, got 0.0"),
        ("workers.custom_resources={CPU: 1}", "workers.custom_resources.CPU: set workers.num_cpus_per_actor instead"),
        ("model.dtype=int8", "model.dtype must be one of auto, float32, bfloat16, float16, float64, got 'int8'"),
        ("strategy.prompt_lookup.min_ngram=4", "strategy.prompt_lookup.max_ngram must be >= "),
        ("strategy.self_speculative.min_confidence=1.5", "strategy.self_speculative.min_confidence must be in [0, 1]"),
        ("strategy.medusa.choices=[[0],[1,0],[1]]", "strategy.medusa.choices: path [1, 0] comes before its prefix [1]"),
        ("strategy.medusa.choices=[[0],[-1]]", "strategy.medusa.choices: path [-1] has a negative rank"),
        ("strategy.jacobi.init=zeros", "strategy.jacobi.init='zeros': use one of pad, repeat, retrieval"),
    ],
)
def test_bad_values_are_refused_before_anything_is_written(override, message, tmp_path):
    config = load_config(
        default_job_config(), None, [f"input.url={tmp_path / 'in'}", f"output.url={tmp_path / 'out'}", override]
    )
    with pytest.raises(JobError, match=re.escape(message)):
        run_job(config)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["strategy.name=medusa", "strategy.medusa.choices=[[0],[0,0],[0,0,0],[0,0,0,0],[0,0,0,0,0]]"],
            "strategy.medusa.choices: path [0, 0, 0, 0, 0] is deeper than the 4 heads of model.heads=",
        ),
        (
            ["strategy.name=self_speculative", "strategy.self_speculative.exit_layer=6"],
            "strategy.self_speculative.exit_layer=6: model.exits=",
        ),
        (
            ["input.strategy_column=how", "strategy.self_speculative.exit_layer=6"],
            "strategy.self_speculative.exit_layer=6: model.exits=",
        ),
    ],
)
def test_options_the_jobs_own_heads_and_exits_cannot_serve_are_refused_before_anything_is_written(
    overrides, message, tmp_path
):
    """Valid alone, not with the shipped heads (4 of them) and exits (after layers 1-5). The actors would
    refuse them too, but after the job had claimed its output folder, whose corrected rerun would then be
    refused as another job's."""
    config = load_config(
        default_job_config(), None, [f"input.url={tmp_path / 'in'}", f"output.url={tmp_path / 'out'}", *overrides]
    )
    with pytest.raises(JobError, match=re.escape(message)):
        run_job(config)
    assert not (tmp_path / "out").exists()
    # Where no row can reach the strategy, its option does not matter.
    validate(load_config(default_job_config(), None, [*REQUIRED, overrides[-1]]))


def test_top_logprobs_up_to_a_raised_ceiling_pass():
    validate(load_config(default_job_config(), None, [*REQUIRED, "output.top_logprobs=20"]))
    raised = ["output.top_logprobs=50", "output.max_top_logprobs=50"]
    validate(load_config(default_job_config(), None, [*REQUIRED, *raised]))
