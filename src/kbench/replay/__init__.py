"""The execution-state lane (docs/replay.md): forget requests inside a running agent session.

This package holds the plans of the project's session suite (`kbench-sessions`), the provenance graph of a session's runtime state (artifacts, taint
closure, τ, sparse checkpoints), the lane's session record (one JSON object per session ×
operator) and its scorer: exact, action and any leak, CAD against the full reset B5, Leak@probes, cost, B7's
exactness and the tests against B5. Scoring is pure: functions of session records, no model,
no I/O. Every name below is importable from `kbench.replay` directly.
"""

from kbench.replay.environment import SESSION_TOOLS, Delivery, SessionEnvironment
from kbench.replay.provenance import (
    Artifact,
    Checkpoint,
    ClosureComparison,
    ProvenanceError,
    ProvenanceGraph,
    compare_closures,
)
from kbench.replay.records import (
    FULL_RESET,
    MEMORY_DELETE,
    NO_FORGET,
    OPERATORS,
    PROBES,
    SELECTIVE_REPLAY,
    PostTurn,
    SessionFormatError,
    SessionRecord,
    ToolCall,
    read_sessions,
    write_sessions,
)
from kbench.replay.sessions import (
    SESSION_KINDS,
    PlannedTurn,
    SessionPlan,
    SessionPlanError,
    plan_session,
    plan_suite,
)
from kbench.replay.scoring import (
    METRICS,
    VALIDITY_FLOOR,
    ReplayScoringError,
    SessionScores,
    action_leak,
    cad,
    canonical_args,
    exact_leak,
    kept_probes,
    score_sessions,
    score_session,
    score_suite,
    turn_cad,
)

__all__ = [
    "SESSION_KINDS",
    "SESSION_TOOLS",
    "Delivery",
    "SessionEnvironment",
    "PlannedTurn",
    "SessionPlan",
    "SessionPlanError",
    "plan_session",
    "plan_suite",
    "Artifact",
    "Checkpoint",
    "ClosureComparison",
    "ProvenanceError",
    "ProvenanceGraph",
    "compare_closures",
    "FULL_RESET",
    "MEMORY_DELETE",
    "METRICS",
    "NO_FORGET",
    "OPERATORS",
    "PROBES",
    "SELECTIVE_REPLAY",
    "VALIDITY_FLOOR",
    "PostTurn",
    "ReplayScoringError",
    "SessionFormatError",
    "SessionRecord",
    "SessionScores",
    "ToolCall",
    "action_leak",
    "cad",
    "canonical_args",
    "exact_leak",
    "kept_probes",
    "read_sessions",
    "score_sessions",
    "score_session",
    "score_suite",
    "turn_cad",
    "write_sessions",
]
