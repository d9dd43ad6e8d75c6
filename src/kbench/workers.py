"""Work side by side: child processes, `workers` at a time, each on its share of the cores
(`execution.*`): the stages' work queues and the LoRA trainer's step helpers. The cell, inject
and unlearn outputs do not depend on the thread count (tests/test_methods.py,
tests/test_unlearning.py, tests/test_lora.py), so for them this changes wall time only, and once
the queue is empty the one child still working is handed every core (`serve_queue(widen=True)`).
The probes' last float bits do follow the thread count, so their children run on one thread
each and are never widened (docs/probes.md)."""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)


def worker_threads(workers: int) -> int:
    """One of `workers` processes' share of the cores: its thread count."""
    return max(1, (os.cpu_count() or 1) // workers)


def child_env(workers: int) -> dict[str, str]:
    """The environment of one of `workers` children: its share of the cores as its thread count
    (torch reads it when it starts)."""
    threads = str(worker_threads(workers))
    return {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}


def _stop(children: Sequence[subprocess.Popen]) -> None:
    """Terminate the children still running and wait for all (a failed or interrupted stage)."""
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        child.wait()


#: What a queue child prints on its stdout after each item it finished (`run_queue`).
QUEUE_DONE = "kbench-queue-done"
#: What a queue child prints once it may be handed every core (`serve_queue(widen=True)`).
QUEUE_WIDEN = "kbench-queue-widen"
#: The signal that hands the last working child every core.
WIDEN_SIGNAL = signal.SIGUSR1


def _use_every_core(signum: int, frame: object) -> None:
    """A widened child's signal handler: torch on every core from its next operation (Python
    runs it in the main thread between operations, never inside one)."""
    import torch  # heavy; the child's stage has loaded it already

    torch.set_num_threads(worker_threads(1))


def serve_queue(handle: Callable[[str], None], *, widen: bool = False) -> None:
    """The child side of `run_queue`: `handle` each item read from stdin, one per line, and
    print the marker after each so the parent hands over the next. `widen`: the child's work
    gives the same bytes on any thread count, so the parent may hand it every core once it is
    the last one working (a stage whose results depend on the thread count leaves it off)."""
    if widen:
        signal.signal(WIDEN_SIGNAL, _use_every_core)
        print(QUEUE_WIDEN, flush=True)  # only now may the parent signal: the handler is in place
    for line in sys.stdin:
        item = line.strip()
        handle(item)
        print(f"{QUEUE_DONE} {item}", flush=True)


def run_queue(command: list[str], items: Sequence[str], workers: int,
              on_done: Callable[[str, float], None]) -> list[str]:
    """Run `items` through `workers` long-lived children of `command`, a work queue: each child
    reads one item per line on its stdin, prints `QUEUE_DONE <item>` when it is finished and
    gets the next, so no child idles while another has a queue (fixed shares left one idle
    behind a slow item). Once the queue is empty and a single child is left working, it gets
    every core if it announced `QUEUE_WIDEN`. `on_done(item, seconds)` runs in this process
    after each. Returns the failures as "item (exit N)"; a failed or interrupted stage never
    leaves a child running."""
    todo = list(items)
    workers = max(1, min(workers, len(todo)))
    env = child_env(workers)
    log.info("%d item(s) through %d child(ren) on %s thread(s) each", len(todo), workers, env["OMP_NUM_THREADS"])
    children = [subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                for _ in range(workers)]
    current: dict[subprocess.Popen, tuple[str, float]] = {}
    pending: dict[subprocess.Popen, bytes] = {child: b"" for child in children}
    widenable: set[subprocess.Popen] = set()  # children whose handler is in place, not yet widened
    failed = []

    def widen_last() -> None:
        """Hand every core to the one child still working once the queue is empty."""
        if not todo and len(current) == 1 and workers > 1:
            (child,) = current
            if child in widenable and child.poll() is None:
                widenable.discard(child)
                child.send_signal(WIDEN_SIGNAL)
                log.info("one child left working (%s): every core handed to it", current[child][0])

    def feed(child: subprocess.Popen) -> None:
        try:
            if todo:
                item = todo.pop(0)
                current[child] = (item, time.perf_counter())
                child.stdin.write((item + "\n").encode())
                child.stdin.flush()
            else:
                current.pop(child, None)
                child.stdin.close()
        except BrokenPipeError:  # the child has died: its end of file reports the item failed
            pass

    def handle(child: subprocess.Popen, line: str) -> None:
        if line.startswith(QUEUE_DONE + " ") and child in current:
            item, started = current[child]
            on_done(item, time.perf_counter() - started)
            feed(child)
            widen_last()
        elif line == QUEUE_WIDEN:
            widenable.add(child)
            widen_last()
        else:
            print(line, flush=True)  # the child's own output, passed through

    selector = selectors.DefaultSelector()
    try:
        for child in children:
            feed(child)
            selector.register(child.stdout, selectors.EVENT_READ, child)
        while selector.get_map():
            for key, _ in selector.select():
                child = key.data
                # Raw reads and our own line split: a buffered reader could hold a marker line
                # that select() never reports again.
                data = os.read(child.stdout.fileno(), 1 << 16)
                if not data:  # the child exited: its item (if any) failed
                    selector.unregister(child.stdout)
                    code = child.wait()
                    if pending[child]:
                        handle(child, pending[child].decode(errors="replace"))
                    if child in current:
                        failed.append(f"{current.pop(child)[0]} (exit {code})")
                        widen_last()
                    continue
                *lines, pending[child] = (pending[child] + data).split(b"\n")
                for line in lines:
                    handle(child, line.decode(errors="replace"))
    finally:
        _stop(children)
    return failed + [f"{item} (not run: every child had exited)" for item in todo]
