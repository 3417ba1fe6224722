"""The `accelgen` command's end: after `generate`, Ray stopped without waiting on its monitor, and the
process left without the interpreter's teardown; every other command exits as Python does."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import ray

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


def _node(kinds: list[str]) -> SimpleNamespace:
    """A stand-in for Ray's node: its processes by kind, and the stop it does one kind at a time."""
    log: list = []

    def process(kind: str) -> SimpleNamespace:
        return SimpleNamespace(poll=lambda: None, kill=lambda: log.append(("SIGKILL", kind)))

    node = SimpleNamespace(all_processes={k: [SimpleNamespace(process=process(k))] for k in kinds}, log=log)
    node._kill_process_type = lambda kind, *args, **kwargs: log.append(("ray stops", kind))
    return node


def test_the_monitor_is_killed_outright_and_every_other_kind_left_to_ray(monkeypatch):
    node = _node(["raylet", "gcs_server", "monitor", "log_monitor"])
    monkeypatch.setattr(ray._private.worker, "_global_node", node)
    cluster._stop_the_monitor_at_once()
    for kind in ["raylet", "gcs_server", "monitor", "log_monitor"]:
        node._kill_process_type(kind, check_alive=False, allow_graceful=True)
    assert node.log == [
        ("ray stops", "raylet"),
        ("ray stops", "gcs_server"),
        ("SIGKILL", "monitor"),
        ("ray stops", "monitor"),
        ("ray stops", "log_monitor"),
    ]


def test_a_node_unlike_ray_2_60s_is_left_to_ray(monkeypatch):
    node = SimpleNamespace(all_processes=None)
    monkeypatch.setattr(ray._private.worker, "_global_node", node)
    cluster._stop_the_monitor_at_once()
    assert not hasattr(node, "_kill_process_type")


def test_a_cluster_of_the_jobs_own_stops_whole():
    """On a real cluster: Ray's node is as the stop expects it (or the monitor would again cost a second
    at the end of every job), and nothing it started outlives `stop_ray`."""
    script = (
        "import ray\n"
        "from pipeline.cluster import init_ray, stop_ray\n"
        "init_ray('')\n"
        "node = ray._private.worker._global_node\n"
        "assert callable(node._kill_process_type) and 'monitor' in node.all_processes, node.all_processes\n"
        "started = [info.process for infos in node.all_processes.values() for info in infos]\n"
        "stop_ray()\n"
        "print('left running:', [p.args[:1] for p in started if p.poll() is None])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "left running: []" in out.stdout
