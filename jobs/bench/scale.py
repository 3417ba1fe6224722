"""What the benchmarks of the driver's scale share: a command line, a local S3 endpoint, and runs measured in a
process of their own.

The endpoint is moto's S3 server, as the tests start it, but in its own process: its CPU and
memory are then not counted as the driver's. Each measured step runs in a fresh child process,
so its peak memory (`ru_maxrss`) is the step's own plus the imports a driver has anyway (reported
as `baseline`).
"""

from __future__ import annotations

import multiprocessing
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from pipeline.config import load_config
from pipeline.errors import JobError

Bench = TypeVar("Bench")

# Credentials moto accepts; they reach nothing but the loopback endpoint this module starts.
MOTO_CREDENTIALS = {"key": "AKIABENCHMARKKEYID000", "secret": "benchmark-secret"}


def bench_main(usage: str, bench: Bench, args: list[str], run: Callable[[Bench], int]) -> int:
    """`python -m jobs.bench.<name> [key=value ...]`: `usage` on -h/--help; a wrong key or value is one
    `error:` line and status 2, as `accelgen` prints it; else `run` with `bench` loaded from the args."""
    if "-h" in args or "--help" in args:
        print(usage)
        return 0
    try:
        loaded = load_config(bench, None, args)
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run(loaded)


class LocalS3:
    """moto's S3 server on 127.0.0.1 in a child process, for as long as the `with` block runs."""

    def __enter__(self) -> LocalS3:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1).close()
                return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"moto's S3 server did not start on port {self.port} (is moto[server] installed?)"
                    ) from None
                time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def storage_options(self) -> dict[str, Any]:
        return {**MOTO_CREDENTIALS, "client_kwargs": {"endpoint_url": self.endpoint}}


def measured(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """`fn(*args)` in a fresh process: its result, plus `baseline_mb` (resident after imports) and
    `peak_mb` (the process's peak resident memory). `fn` may report `ready_mb` itself: resident once
    its fixed costs are paid (an S3 client loads botocore's service model, tens of megabytes)."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(_run_measured, (fn, *args))


def _run_measured(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    baseline_mb = resident_mb()
    result = fn(*args)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {**result, "baseline_mb": round(baseline_mb, 1), "peak_mb": round(peak_mb, 1)}


def resident_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0
