"""The actor's per-unit path beside its decoding thread.

A unit's thread builds and stages its part while the actor's next batch decodes; the two share the
GIL, so whatever the unit's thread does holding it, the batch waits for. A module the output path
loads on first use (pyarrow imports pandas at its first array of Python values: about half a
second) must therefore load while the actor starts, not while its first part is built.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# Run in a fresh interpreter: this test session has long since loaded every module.
FIRST_UNIT = """
import gc
import sys
from pathlib import Path

from job_config import job_config
from pipeline.driver import worker_spec
from workers.generator import Generator
from workers.common.spec import WorkUnit
from workers.unit_rows import read_unit

model, tmp = sys.argv[1], sys.argv[2]
shard = f"{tmp}/in/shard.parquet"
spec = worker_spec(job_config(Path(tmp), model, "generation.max_new_tokens=3"), "job")
generator = Generator(spec)
assert gc.get_freeze_count() > 100_000, gc.get_freeze_count()  # what it loaded, out of the collector's scans
unit = WorkUnit("u", shard, "shard.parquet", (0,), 0, 2)
read_unit(spec, unit)  # reading the input loads its filesystem's module, before any row decodes
loaded = set(sys.modules)
result = generator.run_unit(unit, 1, f"{tmp}/staged.parquet", f"{tmp}/log.jsonl", {})
assert result.num_rows == 2 and result.generated_tokens == 6, result
print(sorted(set(sys.modules) - loaded))
"""


def test_the_first_unit_loads_no_module_and_the_loaded_heap_is_frozen(tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"prompt": ["def add(a, b):", "import os"]}), tmp_path / "in" / "shard.parquet")
    tests = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", FIRST_UNIT, str(tiny_model_dir), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
