"""The stage process pool: results come back as objects, a task's error is reported under its
item while the others go on, a worker that dies fails what it left, each worker runs on its
share of the cores, and a failed or interrupted run leaves no worker behind."""

from __future__ import annotations

import os
import time

import pytest

from kbench.workers import process_pool, run_pool, stop_pool, worker_threads


def square(item: int) -> dict:
    """A task: its result is an object, not a line of output."""
    if item == 3:
        raise ValueError("three is refused")
    return {"item": item, "square": item * item, "pid": os.getpid()}


def threads_and_env(_: object) -> tuple[int, str]:
    import torch

    return torch.get_num_threads(), os.environ["OMP_NUM_THREADS"]


def library_threads(_: object) -> set[int]:
    from threadpoolctl import threadpool_info

    return {pool["num_threads"] for pool in threadpool_info()}


def die(item: int) -> int:
    if item == 0:
        os._exit(7)  # a worker killed mid-task (out of memory, a signal)
    time.sleep(0.5)
    return item


def sleep_long(_: object) -> None:
    time.sleep(120)


def test_results_come_back_as_objects_and_a_task_error_is_named(caplog):
    done = {}
    failed = run_pool(square, [1, 2, 3, 4, 5], 2, lambda item, result, seconds: done.update({item: result}),
                      label=lambda item: f"item {item}")
    assert failed == ["item 3 (ValueError: three is refused)"]
    assert sorted(done) == [1, 2, 4, 5] and done[4]["square"] == 16
    assert {result["pid"] for result in done.values()} - {os.getpid()}  # computed in other processes
    assert "item 3 failed" in caplog.text and "three is refused" in caplog.text


def test_each_worker_runs_on_its_share_of_the_cores():
    results = []
    run_pool(threads_and_env, [0, 1], 2, lambda item, result, seconds: results.append(result))
    assert results == [(worker_threads(2), str(worker_threads(2)))] * 2
    results.clear()
    run_pool(threads_and_env, [0], 2, lambda item, result, seconds: results.append(result), threads=1)
    assert results == [(1, "1")]


def test_libraries_loaded_before_the_initializer_are_limited_too():
    """numpy (imported here, so by the spawned worker's main module too) keeps OpenBLAS at the
    worker's share, not at the machine's cores."""
    import numpy  # noqa: F401

    results = []
    run_pool(library_threads, [0], 2, lambda item, result, seconds: results.append(result), threads=1)
    assert results == [{1}]


def test_a_worker_that_dies_fails_its_items_and_is_reported():
    done = []
    failed = run_pool(die, [0, 1, 2], 1, lambda item, result, seconds: done.append(item))
    assert done == [] and failed == [f"{item} (not run: a worker process died)" for item in (0, 1, 2)]


def test_stopping_a_pool_ends_every_worker():
    pool = process_pool(2, threads=1)
    futures = [pool.submit(sleep_long, None) for _ in range(2)]
    deadline = time.monotonic() + 60
    while len(pool._processes) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    processes = list(pool._processes.values())
    stop_pool(pool)
    assert processes and not any(process.is_alive() for process in processes)
    for future in futures:
        with pytest.raises(Exception):
            future.result(timeout=30)


def test_an_empty_queue_starts_no_process():
    assert run_pool(square, [], 4, lambda *a: pytest.fail("nothing to do")) == []
