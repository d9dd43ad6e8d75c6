"""The memory-unlearning lane (SPEC §15): forget requests to agent memory systems.

This package holds the lane's instances (generated from the corpus), its item record (one JSON object per probe reply) and its scorer:
the judging rules, the RA / FE / PR / RLA / AR items, RPR, the Score and their cluster-bootstrap
intervals over instances. Scoring is pure: functions of item records, no model, no I/O.
Every name below is importable from `kbench.memory` directly.
"""

from kbench.memory.instances import (
    TIER_SIZES,
    Instance,
    InstanceFormatError,
    Probe,
    Request,
    TierSize,
    make_instance,
    make_instances,
    read_instances,
    write_instances,
)
from kbench.memory.records import (
    ATTACKS,
    REQUEST_TYPES,
    SUITES,
    TIERS,
    VERSIONS,
    ItemRecord,
    MemoryItemFormatError,
    iter_items,
    read_items,
    validate_item,
    write_items,
)
from kbench.memory.scoring import (
    AFFIRMATIVE_OPENINGS,
    METRICS,
    Bootstrap,
    Estimate,
    Item,
    SystemScores,
    boolean_leak,
    estimate,
    gives,
    instance_tiers,
    judge_items,
    leaks,
    resample_counts,
    score_items,
    score_records,
)

__all__ = [
    "TIER_SIZES",
    "Instance",
    "InstanceFormatError",
    "Probe",
    "Request",
    "TierSize",
    "make_instance",
    "make_instances",
    "read_instances",
    "write_instances",
    "AFFIRMATIVE_OPENINGS",
    "ATTACKS",
    "METRICS",
    "REQUEST_TYPES",
    "SUITES",
    "TIERS",
    "VERSIONS",
    "Bootstrap",
    "Estimate",
    "Item",
    "ItemRecord",
    "MemoryItemFormatError",
    "SystemScores",
    "boolean_leak",
    "estimate",
    "gives",
    "instance_tiers",
    "iter_items",
    "judge_items",
    "leaks",
    "read_items",
    "resample_counts",
    "score_items",
    "score_records",
    "validate_item",
    "write_items",
]
