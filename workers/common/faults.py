"""Fault injection for the reliability tests, off unless `ACCELGEN_TEST_FAULTS` holds a JSON plan.

The plan names where to fail, so tests reproduce real failures at chosen points:

    {"exit_at_row":  {"unit": "00001-00000", "row": 3, "attempts": [1]},   # os._exit mid-unit
     "hang_at_row":  {"unit": "00000-00000", "row": 0, "attempts": [1],    # stop making progress
                      "seconds": 120},                                     # (default: an hour)
     "exit_after_upload": {"unit": "00000-00000", "attempts": [1]},        # staged, not returned
     "crash_row_id": "a.parquet#5",                                        # every attempt dies on it
     "batch_sleep_s": 0.5,                                                 # slow decoding down
     "driver_exit_after_commits": 2,                                       # the driver dies
     "driver_sigterm_after_commits": 1}                                    # ... is asked to stop

Rows are indices within the unit. The driver forwards the variable to its actors.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

FAULTS_ENV = "ACCELGEN_TEST_FAULTS"


def plan() -> dict[str, Any]:
    raw = os.environ.get(FAULTS_ENV)
    return json.loads(raw) if raw else {}


def _hit(spec: dict[str, Any] | None, unit_id: str, attempt: int) -> bool:
    return bool(spec) and spec["unit"] == unit_id and attempt in spec.get("attempts", [attempt])


def before_batch(faults: dict[str, Any], unit_id: str, attempt: int, rows: list[int], row_ids: list[str]) -> None:
    """Called before decoding the unit's `rows` (indices) with their ids."""
    if not faults:
        return
    if "batch_sleep_s" in faults:
        time.sleep(faults["batch_sleep_s"])
    exit_at, hang_at = faults.get("exit_at_row"), faults.get("hang_at_row")
    if _hit(exit_at, unit_id, attempt) and exit_at["row"] in rows:
        os._exit(1)
    if _hit(hang_at, unit_id, attempt) and hang_at["row"] in rows:
        time.sleep(hang_at.get("seconds", 3600))
    if faults.get("crash_row_id") in row_ids:
        os._exit(1)


def after_upload(faults: dict[str, Any], unit_id: str, attempt: int) -> None:
    if _hit(faults.get("exit_after_upload"), unit_id, attempt):
        os._exit(1)


def after_commit(faults: dict[str, Any], commits: int) -> None:
    """Called by the driver after each commit of this run. The SIGTERM is the driver's own, so the
    test of a stop between commits knows where the stop lands, however fast the job runs."""
    if faults.get("driver_exit_after_commits") == commits:
        os._exit(137)
    if faults.get("driver_sigterm_after_commits") == commits:
        os.kill(os.getpid(), signal.SIGTERM)
