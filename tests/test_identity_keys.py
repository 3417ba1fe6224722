"""Keys added to the config after jobs were first identified join a job's identity only when set away
from their default, so that an output folder written before they existed still resumes; set, they make
another job."""

from __future__ import annotations

from jobs.shipped import default_job_config
from pipeline.fingerprint import LATER_KEYS, fingerprint, identity


def _identity(**changes):
    config = default_job_config()
    for key, value in changes.items():
        section, name = key.split("__")
        setattr(getattr(config, section), name, value)
    return identity(config, [], {"target": "sha"})


def test_later_keys_at_their_defaults_leave_the_identity_as_it_was():
    ident = _identity()
    for section, keys in LATER_KEYS.items():
        assert not set(keys) & set(ident[section]), section
    assert {"temperature", "max_new_tokens", "seed"} <= set(ident["generation"])  # earlier keys all stay


def test_a_later_key_set_away_from_its_default_makes_another_job():
    base = fingerprint(_identity())
    changed = [
        _identity(generation__min_tokens=4),
        _identity(generation__presence_penalty=0.5),
        _identity(generation__logit_bias={7: -100.0}),
        _identity(strategy__reproducible_sampling=False),
    ]
    assert len({base, *(fingerprint(c) for c in changed)}) == 5
