"""The stage work queue: children take items until the queue is empty; a child that dies fails
its item only; items no child could take are reported."""

from __future__ import annotations

import sys

from kbench.stages.workers import QUEUE_DONE, run_queue

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
