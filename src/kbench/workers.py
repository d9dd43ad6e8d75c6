"""Work side by side on a standard process pool: `concurrent.futures.ProcessPoolExecutor` in the
spawn context, `workers` processes, each on its share of the cores (`execution.*`). Items are
objects handed to a module-level task function; its return value (or its exception) comes back
as an object. The cell, inject and unlearn outputs do not depend on the thread count
(tests/test_methods.py, tests/test_unlearning.py, tests/test_lora.py); the probes' last float
bits do, so their workers run on one thread each whatever the pool (docs/probes.md).

This module imports no torch: a worker sets its thread count before its first task imports it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

log = logging.getLogger(__name__)

Item = TypeVar("Item")

#: The start method of every pool: a fresh interpreter per worker (no forked torch state).
START_METHOD = "spawn"
#: The format of every log line, in the command's process and in its workers alike.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_DATE_FORMAT = "%H:%M:%S"


def configure_logging(level: int) -> None:
    """The project's log format at `level` (the `kbench` command and each pool worker)."""
    logging.basicConfig(level=level, format=LOG_FORMAT, datefmt=LOG_DATE_FORMAT)
    # faiss logs each CPU-feature build it fails to load at INFO; only its warnings matter here.
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    # The HTTP client under the openai backend logs one INFO line per request: noise in a cell log.
    for name in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(name).setLevel(logging.WARNING)


def worker_threads(workers: int) -> int:
    """One of `workers` processes' share of the cores: its thread count."""
    return max(1, (os.cpu_count() or 1) // workers)


def use_threads(threads: int) -> None:
    """This process's compute threads: the environment read by libraries that start later, the
    pools of those already loaded (a spawned worker imports the command's main module, and with
    it numpy's and scipy's OpenBLAS, before its initializer runs: threadpoolctl limits them), and
    torch's own count."""
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    import torch
    from threadpoolctl import threadpool_limits

    threadpool_limits(threads)
    torch.set_num_threads(threads)


def start_worker(threads: int, log_level: int) -> None:
    """A pool worker's initializer: its share of the cores and the command's log format."""
    configure_logging(log_level)
    use_threads(threads)


def process_pool(workers: int, *, threads: int | None = None, initializer: Callable[..., None] = start_worker,
                 initargs: tuple = ()) -> ProcessPoolExecutor:
    """A spawn-context pool of `workers` processes on `threads` threads each (default: their share
    of the cores). `initializer(threads, log_level, *initargs)` runs first in each worker."""
    threads = worker_threads(workers) if threads is None else threads
    return ProcessPoolExecutor(
        max_workers=workers, mp_context=multiprocessing.get_context(START_METHOD), initializer=initializer,
        initargs=(threads, logging.getLogger().getEffectiveLevel(), *initargs),
    )


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and end every worker now (a failed or interrupted stage leaves
    no process behind). Python 3.14's `terminate_workers()` does this; 3.11 has no public call."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # shutdown forgets them
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join()
    # The pool's own thread may reap a worker between our waitpid and its record of the exit code
    deadline = time.monotonic() + 10
    while any(process.exitcode is None for process in processes) and time.monotonic() < deadline:
        time.sleep(0.01)


def _timed(task: Callable[[Any], Any], item: Any) -> tuple[Any, float]:
    """Run `task(item)` in a worker; its result and the seconds it took."""
    started = time.perf_counter()
    return task(item), time.perf_counter() - started


def run_items(task: Callable[[Item], Any], items: Sequence[Item], workers: int,
              on_done: Callable[[Item, Any, float], None]) -> list[str]:
    """`run_pool`, or with one worker each item in this process (a GPU; tests), in order:
    `on_done(item, result, seconds)` after each. Returns the pool's failures (none in process:
    an error there is raised)."""
    if workers > 1:
        return run_pool(task, items, workers, on_done)
    for item in items:
        started = time.perf_counter()
        result = task(item)
        on_done(item, result, time.perf_counter() - started)
    return []


def run_pool(task: Callable[[Item], Any], items: Sequence[Item], workers: int,
             on_done: Callable[[Item, Any, float], None], *, label: Callable[[Item], str] = str,
             threads: int | None = None) -> list[str]:
    """Run `task` on each of `items` in a pool of `workers` processes, a work queue in the given
    order (a worker takes the next item when it finishes one, so none idles behind a slow item).
    `on_done(item, result, seconds)` runs in this process after each. Returns the failures as
    "label (why)": a task that raised names its error, and once a worker dies (killed, out of
    memory) the items it left are reported as not run. An interrupted or failed call ends every
    worker before it returns."""
    todo = list(items)
    if not todo:
        return []
    workers = max(1, min(workers, len(todo)))
    share = worker_threads(workers) if threads is None else threads
    log.info("%d item(s) through %d worker(s) on %d thread(s) each", len(todo), workers, share)
    failed: list[str] = []
    pool = process_pool(workers, threads=share)
    try:
        futures: dict[Future, Item] = {pool.submit(_timed, task, item): item for item in todo}
        for future in as_completed(futures):
            item = futures[future]
            try:
                result, seconds = future.result()
            except BrokenProcessPool:
                failed.append(f"{label(item)} (not run: a worker process died)")
            except Exception as exc:  # the task's own error, raised in the worker (traceback: its cause)
                log.error("%s failed", label(item), exc_info=exc)
                failed.append(f"{label(item)} ({type(exc).__name__}: {' '.join(str(exc).split())})")
            else:
                on_done(item, result, seconds)
    except BaseException:
        stop_pool(pool)
        raise
    pool.shutdown(wait=True)
    return failed
