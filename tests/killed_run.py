"""A training job killed after a checkpoint and run again: how every training job's resume is tested."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from jobs.train import checkpoint


class Interrupted(Exception):
    """The kill: raised where the run asks its sampler for a batch."""


def killed_then_rerun(
    main: Callable[[list[str]], int],
    args: list[str],
    sampler: type,
    kill_at_step: int,
    output_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> tuple[int, str]:
    """`main(args)` killed when `sampler` is asked for step `kill_at_step`'s batch (that step's work and any
    since the last checkpoint are lost and must be redone), then run again to its end: the step of the
    checkpoint the kill left in `output_dir`, and what the rerun printed."""
    real_batch = sampler.batch

    def batch_until_killed(self: object, step: int, config: object) -> torch.Tensor:
        if step == kill_at_step:
            raise Interrupted
        return real_batch(self, step, config)

    with monkeypatch.context() as patch:
        patch.setattr(sampler, "batch", batch_until_killed)
        with pytest.raises(Interrupted):
            main(args)
    checkpointed = torch.load(output_dir / "checkpoint" / checkpoint.STATE_FILE, weights_only=True)["step"]
    capsys.readouterr()
    assert main(args) == 0
    return checkpointed, capsys.readouterr().out


def same_weights(first: Path, second: Path) -> bool:
    """Whether two safetensors files hold the same tensors under the same names, to the bit."""
    a, b = load_file(first), load_file(second)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
