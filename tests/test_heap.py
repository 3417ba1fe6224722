"""`freeze_loaded`: garbage collected first, everything alive then out of the collector's scans."""

from __future__ import annotations

import subprocess
import sys

# In a fresh interpreter: freezing is process-wide.
SCRIPT = """
import gc
import weakref

from strategies.runtime.heap import freeze_loaded


class Node:
    pass


garbage = Node()
garbage.me = garbage  # a cycle only the collector frees
dead = weakref.ref(garbage)
del garbage
kept = [[i] for i in range(10_000)]
before = gc.get_freeze_count()
freeze_loaded()
assert dead() is None, "a cycle of garbage was frozen instead of collected"
assert gc.get_freeze_count() >= before + len(kept), (before, gc.get_freeze_count())
assert gc.collect() == 0
print("ok")
"""


def test_garbage_is_collected_and_what_is_alive_frozen():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
