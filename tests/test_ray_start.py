"""`accelgen generate` starts Ray while the driver imports, and not at all for a finished output folder."""

from __future__ import annotations

import sys

import pytest

from jobs.cli import main
from pipeline import cluster, driver
from pipeline.driver import JobOutcome


@pytest.fixture
def recorded(monkeypatch):
    """`accelgen generate` with Ray's start and the job itself recorded instead of run."""
    calls = {"started": [], "phases": []}
    monkeypatch.setattr(cluster, "start_while_importing", lambda *args: calls["started"].append(args))

    def run_job(config, phases=None):
        calls["phases"].append(dict(phases.seconds))
        return JobOutcome("succeeded", {})

    monkeypatch.setattr(driver, "run_job", run_job)
    return calls


def test_a_job_to_run_starts_ray_beside_the_drivers_import_on_its_clock(tmp_path, recorded):
    assert main(["generate", f"input.url={tmp_path / 'in'}", f"output.url={tmp_path / 'out'}"]) == 0
    assert recorded["started"] == [("", "pipeline.driver")]
    assert list(recorded["phases"][0]) == ["ray_start"]  # the job's phases begin with it


def test_a_finished_output_folder_starts_no_ray(tmp_path, recorded):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "_SUCCESS").write_text("")
    assert main(["generate", f"input.url={tmp_path / 'in'}", f"output.url={tmp_path / 'out'}"]) == 0
    assert recorded["started"] == [] and recorded["phases"] == [{}]


def test_ray_starts_while_the_module_imports_and_an_import_error_reaches_the_caller(tmp_path, monkeypatch):
    # The stand-in driver imports only once Ray has begun to start, and Ray's start ends only once the
    # import is done: either order of a serial start waits out a timeout and fails.
    (tmp_path / "rendezvous.py").write_text(
        "import threading\nstarted, imported = threading.Event(), threading.Event()\n"
    )
    (tmp_path / "driver_stand_in.py").write_text(
        "\n".join(["import rendezvous", "assert rendezvous.started.wait(30), 'too soon'", "rendezvous.imported.set()"])
    )
    (tmp_path / "broken_module.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import rendezvous

    ended_after_import = []

    def init_ray(address):
        rendezvous.started.set()
        ended_after_import.append(rendezvous.imported.wait(30))

    monkeypatch.setattr(cluster, "init_ray", init_ray)
    cluster.start_while_importing("", "driver_stand_in")
    assert ended_after_import == [True] and "driver_stand_in" in sys.modules
    with pytest.raises(RuntimeError, match="broken at import"):
        cluster.start_while_importing("", "broken_module")
