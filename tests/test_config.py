"""The typed job config: YAML plus overrides, clear errors, and --help documenting every key."""

from __future__ import annotations

import pytest

from jobs.cli import main
from jobs.shipped import default_job_config
from pipeline.config import JobConfig, describe, load_config, to_plain_dict
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


def test_storage_options_are_redacted():
    config = load_config(default_job_config(), None, [*REQUIRED, "input.storage_options.secret=s3cr3t"])
    plain = to_plain_dict(config)
    assert "s3cr3t" not in str(plain) and plain["input"]["storage_options"] == {"secret": "<redacted>"}


def test_cli_reports_job_errors_with_status_2(capsys):
    assert main(["generate", "input.url=/nonexistent", "output.url=/tmp/x", "strategy.name=nope"]) == 2
    err = capsys.readouterr().err
    assert "strategy.name 'nope' is unknown; available: auto, autoregressive, blockwise" in err
