"""A session's provenance: source ids propagate to what is computed from them, the taint
closure and τ come from the revoked source, the restore point is the last checkpoint before τ,
and the data-flow closure is set beside the oracle one."""

from __future__ import annotations

import pytest

from kbench.replay.provenance import Artifact, Checkpoint, ProvenanceError, ProvenanceGraph, compare_closures

Z = "Quentin Marlowe"


def session() -> ProvenanceGraph:
    """Turn 1 reads a harmless record; turn 2's tool returns z (source s-obs2); the thought, the
    note and the answer after it derive from it; turn 3 acts on the note without z's string and
    reads z again from another source."""
    g = ProvenanceGraph()
    g.checkpoint(Checkpoint(1, "session_start", 0))
    g.add(Artifact("u1", "user", 1, text="who manages the lab?"))
    g.add(Artifact("o1", "observation", 1, parents=("u1",), source_ids=frozenset({"s-obs1"}), text="lab: building 4"))
    g.add(Artifact("a1", "answer", 1, parents=("o1",), text="building 4"))
    g.checkpoint(Checkpoint(2, "turn", 120))
    g.add(Artifact("u2", "user", 2, text="and its manager?"))
    g.add(Artifact("o2", "observation", 2, parents=("u2",), source_ids=frozenset({"s-obs2"}),
                   text=f"MANAGER: {Z.upper()}"))  # z in a form the test's reader below misses
    g.add(Artifact("t2", "thought", 2, parents=("o2",), text=f"the manager is {Z}"))
    g.add(Artifact("m2", "memory", 2, parents=("t2",), text=f"remember: manager {Z}"))
    g.add(Artifact("a2", "answer", 2, parents=("t2",), text=f"{Z}."))
    g.checkpoint(Checkpoint(3, "turn", 260))
    g.add(Artifact("u3", "user", 3, text="email the manager"))
    g.add(Artifact("c3", "action", 3, parents=("u3", "m2"), text="send_message(to=the lab's manager)"))
    g.add(Artifact("x3", "observation", 3, parents=("u3",), source_ids=frozenset({"s-obs3"}),
                   text=f"directory lists {Z} too"))
    return g


def test_sources_propagate_and_the_closure_follows_the_revoked_source():
    g = session()
    assert g.artifacts["c3"].source_ids == {"s-obs2"}  # via the memory note
    assert g.taint_closure("s-obs2") == {"o2", "t2", "m2", "a2", "c3"}
    assert g.tau("s-obs2") == 2
    assert g.restore_point(2) == Checkpoint(2, "turn", 120)
    assert g.restore_point(1).reason == "session_start"


def test_the_data_flow_closure_beside_the_oracle_one():
    comparison = compare_closures(session(), "s-obs2", lambda text: Z in text)
    assert comparison.oracle_only == {"o2"}  # z's source, whose form the reader missed
    assert comparison.inferred_only == {"x3"}  # z's string from another source
    assert comparison.to_json()["inferred"] == ["a2", "c3", "m2", "t2", "x3"]


def test_bad_artifacts_and_checkpoints_are_refused():
    g = session()
    with pytest.raises(ProvenanceError, match="already in the graph"):
        g.add(Artifact("u1", "user", 4))
    with pytest.raises(ProvenanceError, match="parent nope is not in the graph"):
        g.add(Artifact("y", "thought", 4, parents=("nope",)))
    with pytest.raises(ProvenanceError, match="never entered"):
        g.tau("s-unknown")
    with pytest.raises(ProvenanceError, match="in order"):
        g.checkpoint(Checkpoint(2, "turn", 400))
    with pytest.raises(ProvenanceError, match="no checkpoint before turn 0"):
        g.restore_point(0)
