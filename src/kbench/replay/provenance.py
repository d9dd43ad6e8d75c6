"""A session's provenance (docs/replay.md, "Provenance and checkpoints"): the artifacts of its runtime state,
where each came from,
and the sparse checkpoints an operator may restore.

Every artifact (observation, thought, action, answer, summary, memory note, plan) records its
parents (the artifacts it was computed from) and its source ids (the external inputs it carries,
propagated from its parents: the paper's oracle provenance). The taint closure of a revoked
source s is every artifact that carries s or descends from one that does; τ is the first turn
of that closure. `inferred_closure` reads the same question from the data instead: the
artifacts whose text holds z (the observer's matcher) and what descends from them; where the
two disagree is reported, not resolved. Pure: no model, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

#: The kinds of artifact a session's state is made of.
ArtifactType = Literal["observation", "thought", "action", "answer", "summary", "memory", "plan", "user"]
ARTIFACT_TYPES: tuple[str, ...] = get_args(ArtifactType)
#: Why a checkpoint was taken (docs/replay.md, "Provenance and checkpoints").
CheckpointReason = Literal["session_start", "turn", "memory_injection", "consequential_call", "compression"]
CHECKPOINT_REASONS: tuple[str, ...] = get_args(CheckpointReason)


class ProvenanceError(ValueError):
    """An artifact that cannot join the graph (an unknown parent, a repeated id, ...)."""


@dataclass(frozen=True)
class Artifact:
    """One piece of a session's runtime state."""

    #: Unique within the session.
    id: str
    #: What it is.
    type: ArtifactType
    #: The turn that produced it (0: before the first turn, e.g. the system prompt's notes).
    turn: int
    #: The artifacts it was computed from (earlier in the session).
    parents: tuple[str, ...] = ()
    #: External inputs it carries: its own source id for an observation or injection, and
    #: every source id of its parents (filled in by `ProvenanceGraph.add`).
    source_ids: frozenset[str] = frozenset()
    #: Its tokens in the prompt, (start, end) offsets; None when it is not in the prompt.
    token_span: tuple[int, int] | None = None
    #: Whether it is part of the committed state (a shadow-executed call's result is not).
    committed: bool = True
    #: Its text (what the data-flow provenance reads).
    text: str = ""


@dataclass(frozen=True)
class Checkpoint:
    """A restorable point of the session: offsets and handles only, never a copy of the tensors."""

    #: The turn boundary it precedes (the state before turn `turn` ran, or before an event in it).
    turn: int
    #: Why it was taken.
    reason: CheckpointReason
    #: The prompt's length in tokens at that point (the KV cache is cropped back to it).
    token_offset: int
    #: The engine's handle of the cache at that point (`kbench.backends.engine.Checkpoint`).
    cache: Any = None
    #: The environment's snapshot id at that point.
    environment: str | None = None
    #: The artifact ids the prompt held, in order.
    inventory: tuple[str, ...] = ()


@dataclass
class ProvenanceGraph:
    """A session's artifacts in the order they were made, and its checkpoints."""

    artifacts: dict[str, Artifact] = field(default_factory=dict)
    checkpoints: list[Checkpoint] = field(default_factory=list)

    def add(self, artifact: Artifact) -> Artifact:
        """Add an artifact; its source ids become its own plus every parent's (propagation)."""
        if artifact.id in self.artifacts:
            raise ProvenanceError(f"artifact {artifact.id} is already in the graph")
        if artifact.type not in ARTIFACT_TYPES:
            raise ProvenanceError(f"artifact {artifact.id}: unknown type {artifact.type!r}; one of {ARTIFACT_TYPES}")
        sources = set(artifact.source_ids)
        for parent in artifact.parents:
            if parent not in self.artifacts:
                raise ProvenanceError(f"artifact {artifact.id}: parent {parent} is not in the graph")
            sources |= self.artifacts[parent].source_ids
        stored = Artifact(**{**artifact.__dict__, "source_ids": frozenset(sources)})
        self.artifacts[artifact.id] = stored
        return stored

    def checkpoint(self, checkpoint: Checkpoint) -> None:
        if checkpoint.reason not in CHECKPOINT_REASONS:
            raise ProvenanceError(f"unknown checkpoint reason {checkpoint.reason!r}; one of {CHECKPOINT_REASONS}")
        if self.checkpoints and checkpoint.turn < self.checkpoints[-1].turn:
            raise ProvenanceError("checkpoints are taken in order: never one for a turn before the last one's")
        self.checkpoints.append(checkpoint)

    def children(self) -> dict[str, list[str]]:
        kids: dict[str, list[str]] = {a: [] for a in self.artifacts}
        for artifact in self.artifacts.values():
            for parent in artifact.parents:
                kids[parent].append(artifact.id)
        return kids

    def descendants(self, roots: Iterable[str]) -> set[str]:
        """The roots and every artifact computed from them, directly or not."""
        kids, seen = self.children(), set()
        stack = [r for r in roots if r in self.artifacts]
        while stack:
            node = stack.pop()
            if node not in seen:
                seen.add(node)
                stack.extend(kids[node])
        return seen

    def taint_closure(self, source: str) -> set[str]:
        """Every artifact that carries `source` (oracle propagation) or descends from one that does."""
        carriers = [a.id for a in self.artifacts.values() if source in a.source_ids]
        return self.descendants(carriers)

    def inferred_closure(self, holds_target: Callable[[str], bool]) -> set[str]:
        """The data-flow reading: artifacts whose text holds z, and every artifact computed from them."""
        return self.descendants(a.id for a in self.artifacts.values() if a.text and holds_target(a.text))

    def tau(self, source: str) -> int:
        """The first turn the revoked source reached the state (a reachability query from it)."""
        closure = self.taint_closure(source)
        if not closure:
            raise ProvenanceError(f"source {source} never entered the session's state")
        return min(self.artifacts[a].turn for a in closure)

    def restore_point(self, tau: int) -> Checkpoint:
        """The last checkpoint taken before turn `tau` ran (selective replay restores it)."""
        before = [c for c in self.checkpoints if c.turn <= tau]
        if not before:
            raise ProvenanceError(f"no checkpoint before turn {tau}")
        return before[-1]


@dataclass(frozen=True)
class ClosureComparison:
    """The oracle taint closure beside the data-flow one."""

    oracle: frozenset[str]
    inferred: frozenset[str]

    @property
    def oracle_only(self) -> frozenset[str]:
        """Derived from z's source without holding z's string (a paraphrase, a decision)."""
        return self.oracle - self.inferred

    @property
    def inferred_only(self) -> frozenset[str]:
        """Holding z's string without coming from its source (z seen elsewhere)."""
        return self.inferred - self.oracle

    def to_json(self) -> dict[str, Sequence[str]]:
        return {"oracle": sorted(self.oracle), "inferred": sorted(self.inferred),
                "oracle_only": sorted(self.oracle_only), "inferred_only": sorted(self.inferred_only)}


def compare_closures(graph: ProvenanceGraph, source: str, holds_target: Callable[[str], bool]) -> ClosureComparison:
    return ClosureComparison(frozenset(graph.taint_closure(source)), frozenset(graph.inferred_closure(holds_target)))
