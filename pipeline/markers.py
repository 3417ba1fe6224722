"""The file that marks an output folder's job as finished, read without the rest of the commit protocol.

`pipeline.commit` writes `_SUCCESS` last; `accelgen generate` asks whether it is there before it
imports the driver, to decide whether the job needs Ray at all (`pipeline.cluster`).
"""

from __future__ import annotations

from fsspec import AbstractFileSystem

from workers.common.storage import join

SUCCESS_FILE = "_SUCCESS"


def finished(fs: AbstractFileSystem, folder: str) -> bool:
    """Whether `folder` holds a finished job: one that no run can add units to."""
    return fs.exists(join(folder, SUCCESS_FILE))
