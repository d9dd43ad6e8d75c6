"""The observer: the six channels of a trace record, the matcher and its scoring rules, cell
metrics, the paired statistics and the verdict rules (SPEC §6-§10), plus the published-harness
import.

Scoring is pure: functions of trace records (and the `scoring` params), no model, no I/O.
Every name below is importable from `kbench.observer` directly.
"""

from kbench.observer.channels import ATTACKER_BUDGETS, CHANNELS, answer_text, channel_texts
from kbench.observer.matcher import (
    Match,
    ScoringRule,
    canon,
    match,
    register_scoring_rule,
    scoring_rule,
    scoring_rule_names,
    target,
    tokens,
    variants,
)
from kbench.observer.metrics import (
    CellMetrics,
    Interval,
    ScoredQueries,
    cell_metrics,
    degeneration_triggers,
    is_degenerate,
    score_queries,
    score_records,
)
from kbench.observer.published import CellLabels, PublishedFormatError, convert_record, import_published
from kbench.observer.statistics import (
    McNemarResult,
    adjust_by_split,
    benjamini_hochberg,
    eta_squared,
    paired_mcnemar,
    substrate_separation,
    tau_threshold,
    tv_distance,
)
from kbench.observer.verdicts import (
    UNSCORED_VERDICTS,
    VERDICTS,
    CellQuartet,
    VerdictResult,
    compare_cells,
    decide_verdict,
    dominant_channel,
    verdicts_by_budget,
)

__all__ = [
    "ATTACKER_BUDGETS",
    "CHANNELS",
    "UNSCORED_VERDICTS",
    "VERDICTS",
    "CellLabels",
    "CellMetrics",
    "CellQuartet",
    "Interval",
    "Match",
    "McNemarResult",
    "PublishedFormatError",
    "ScoredQueries",
    "ScoringRule",
    "VerdictResult",
    "adjust_by_split",
    "answer_text",
    "benjamini_hochberg",
    "canon",
    "cell_metrics",
    "channel_texts",
    "compare_cells",
    "convert_record",
    "decide_verdict",
    "degeneration_triggers",
    "dominant_channel",
    "eta_squared",
    "import_published",
    "is_degenerate",
    "match",
    "paired_mcnemar",
    "register_scoring_rule",
    "score_queries",
    "score_records",
    "scoring_rule",
    "scoring_rule_names",
    "substrate_separation",
    "target",
    "tau_threshold",
    "tokens",
    "tv_distance",
    "variants",
    "verdicts_by_budget",
]
