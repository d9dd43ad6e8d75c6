"""Stage work side by side: child `kbench` processes, `workers` at a time, each on its share of
the cores (`execution.*`). A stage's outputs do not depend on the thread count (tests/test_methods.py,
tests/test_unlearning.py), so this changes wall time only."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)


def run_side_by_side(jobs: Sequence[tuple[str, list[str]]], workers: int,
                     on_done: Callable[[str, float], None]) -> list[str]:
    """Run each (name, command) with at most `workers` at once; `on_done(name, seconds)` after
    each success, in this process. Returns the failures as "name (exit N)"; a failed or
    interrupted stage never leaves a child running."""
    todo = list(jobs)
    workers = max(1, min(workers, len(todo)))
    threads = str(max(1, (os.cpu_count() or 1) // workers))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    log.info("%d job(s), %d at a time on %s thread(s) each", len(todo), workers, threads)
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    failed = []
    try:
        while todo or running:
            while todo and len(running) < workers:
                name, command = todo.pop(0)
                running[name] = (subprocess.Popen(command, env=env), time.perf_counter())
            time.sleep(0.2)
            for name, (process, started) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[name]
                if process.returncode != 0:
                    failed.append(f"{name} (exit {process.returncode})")
                    continue
                on_done(name, time.perf_counter() - started)
    finally:
        for process, _ in running.values():
            process.terminate()
        for process, _ in running.values():
            process.wait()
    return failed
