"""The stage work queue: children take items until the queue is empty; a child that dies fails
its item only; items no child could take are reported; the last child working is handed every
core only when it asked for that."""

from __future__ import annotations

import logging
import sys

from kbench.workers import QUEUE_DONE, run_queue, worker_threads

CHILD = (
    "import sys\n"
    "for line in sys.stdin:\n"
    "    item = line.strip()\n"
    "    print('some output of', item)\n"  # a child's own lines pass through
    "    if item == 'bad':\n"
    "        raise SystemExit(3)\n"
    f"    print('{QUEUE_DONE}', item, flush=True)\n"
)


def test_the_queue_goes_on_past_a_child_that_dies(capsys):
    done = []
    failed = run_queue([sys.executable, "-c", CHILD], ["a", "bad", "b", "c", "d"], 2,
                       lambda item, seconds: done.append(item))
    assert sorted(done) == ["a", "b", "c", "d"] and failed == ["bad (exit 3)"]
    assert "some output of a" in capsys.readouterr().out


def test_items_no_child_could_take_are_reported():
    failed = run_queue([sys.executable, "-c", "raise SystemExit(1)"], ["x", "y", "z"], 2, lambda *a: None)
    assert sorted(failed) == ["x (exit 1)", "y (exit 1)", "z (not run: every child had exited)"]


def _threads_child(widen: bool) -> str:
    """A queue child: "fast" returns at once; "slow" waits (at most 60 s) for its widening
    handler to have run, then prints the thread count it started with and the one it has."""
    return (
        "import sys, time, torch\n"
        "from kbench import workers\n"
        "start = torch.get_num_threads()\n"  # before the handler exists: the share it was started with
        "widened = []\n"
        "def use_every_core(signum, frame):\n"  # the stage's handler, then a mark (on 1 core no count moves)
        "    own(signum, frame)\n"
        "    widened.append(signum)\n"
        "own, workers._use_every_core = workers._use_every_core, use_every_core\n"
        "def handle(item):\n"
        "    deadline = time.monotonic() + (60 if item == 'slow' else 0)\n"
        "    while not widened and time.monotonic() < deadline:\n"
        "        time.sleep(0.05)\n"
        "    print('threads', item, start, torch.get_num_threads(), flush=True)\n"
        f"workers.serve_queue(handle, widen={widen})\n"
    )


def _threads(out: str, item: str) -> tuple[int, int]:
    line = next(line for line in out.splitlines() if line.startswith(f"threads {item} "))
    return int(line.split()[2]), int(line.split()[3])


def test_the_last_child_working_is_handed_every_core(capsys, caplog):
    """Once "fast" is done and the queue is empty, the child still on "slow" gets every core."""
    caplog.set_level(logging.INFO, logger="kbench.workers")
    failed = run_queue([sys.executable, "-c", _threads_child(True)], ["slow", "fast"], 2, lambda *a: None)
    assert failed == []
    assert _threads(capsys.readouterr().out, "slow") == (worker_threads(2), worker_threads(1))
    assert "one child left working (slow): every core handed to it" in caplog.text


def test_a_child_that_did_not_ask_is_never_signalled(capsys, caplog):
    """A child without `widen` keeps its share (the signal would have ended it: the item would fail)."""
    caplog.set_level(logging.INFO, logger="kbench.workers")
    child = _threads_child(False).replace("60 if", "2 if")
    failed = run_queue([sys.executable, "-c", child], ["slow", "fast"], 2, lambda *a: None)
    assert failed == []
    assert _threads(capsys.readouterr().out, "slow") == (worker_threads(2), worker_threads(2))
    assert "every core handed" not in caplog.text
