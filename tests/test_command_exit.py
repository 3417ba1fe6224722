"""The `accelgen` command's end: after `generate`, Ray stopped and the process left without the
interpreter's teardown; every other command exits as Python does."""

from __future__ import annotations

import pytest

from jobs import cli
from pipeline import cluster


class Left(Exception):
    """`os._exit`, recorded instead of leaving the test run."""


@pytest.fixture
def ending(monkeypatch):
    calls: list = []
    monkeypatch.setattr(cluster, "stop_ray", lambda: calls.append("stop_ray"))
    monkeypatch.setattr(cli.logging, "shutdown", lambda: calls.append("logging handlers flushed"))
    monkeypatch.setattr(cli.sys.stdout, "flush", lambda: calls.append("flush"))

    def leave(status: int) -> None:
        calls.append(("os._exit", status))
        raise Left

    monkeypatch.setattr(cli.os, "_exit", leave)
    return calls


def test_generate_stops_ray_then_leaves_at_once_with_its_status(ending, monkeypatch):
    monkeypatch.setattr(cli.sys, "argv", ["accelgen", "generate", "input.url=x"])
    monkeypatch.setattr(cli, "main", lambda argv: 1 if argv == ["generate", "input.url=x"] else 99)
    with pytest.raises(Left):
        cli.run()
    assert ending.index("stop_ray") < ending.index("logging handlers flushed") < ending.index(("os._exit", 1))
    assert ending.index("stop_ray") < ending.index("flush") < ending.index(("os._exit", 1))
    assert ending[-1] == ("os._exit", 1)


def test_other_commands_exit_as_python_does(ending, monkeypatch):
    monkeypatch.setattr(cli.sys, "argv", ["accelgen", "verify", "out"])
    monkeypatch.setattr(cli, "main", lambda argv: 0)
    with pytest.raises(SystemExit) as exited:
        cli.run()
    assert exited.value.code == 0 and ending == []
