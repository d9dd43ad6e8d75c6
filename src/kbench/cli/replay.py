"""`kbench replay score`: the execution-state lane's metrics of session files (docs/replay.md).

Scoring works on session files alone. Bad input (an unreadable file, an invalid record, a
session without its B5 record) is a one-line error and exit 2 (`kbench.cli`).
"""

from __future__ import annotations

import argparse
import json

from kbench.observer.format import fmt_rate
from kbench.replay.records import read_sessions
from kbench.replay.scoring import METRICS, SuiteMetrics, score_sessions

#: The title of these commands in `kbench --help`.
GROUP = "execution-state lane (session files of forget operators, docs/replay.md)"
#: Width of one metric column in the operators table.
CELL = 12


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def suite_table(suite: str, scores: SuiteMetrics) -> str:
    """One suite's readable listing: operators × metrics, then cost, exactness and probes."""
    state = "valid" if scores.valid else "INVALID (B0 any-leak rate below the floor)"
    lines = [f"{suite}: {scores.sessions} sessions, {state}",
             f"  {'operator':<9}" + "".join(f"{m:>{CELL + 6 if m == 'recomputed_tokens' else CELL}}" for m in METRICS)]
    for operator, m in scores.operators.items():
        cells = [fmt_rate(getattr(m, name)) for name in METRICS[:5]] + [_number(m.transitions), _number(m.recomputed_tokens)]
        lines.append(f"  {operator:<9}" + "".join(f"{c:>{CELL}}" for c in cells[:6]) + f"{cells[6]:>{CELL + 6}}")
    if scores.savings is not None:
        exact, bound = scores.b7_equals_b5, scores.b7_transitions_at_bound
        lines.append(f"  B7 against B5: savings {scores.savings:.2f}x (bound {scores.bound:.2f}x), final state "
                     f"equal on {exact.equal}/{exact.sessions}, transitions at T - tau + 1 on "
                     f"{bound.at_bound}/{bound.sessions}")
    if scores.savings_vs_b5_prime is not None:
        lines.append(f"  B7 against B5': savings {scores.savings_vs_b5_prime:.2f}x (below 1.00x B7 costs more)")
    lines.append(f"  kept probes: {', '.join(scores.kept_probes) or '(no probe kept)'}")
    return "\n".join(lines)


def run_score(args: argparse.Namespace) -> None:
    records = read_sessions(args.files)
    if not records:
        raise ValueError(f"no session records in {', '.join(args.files)}")
    scores = score_sessions(records)
    if args.json:
        print(json.dumps({suite: s.model_dump(mode="json") for suite, s in scores.items()}, indent=2, allow_nan=False))
    else:
        print("\n\n".join(suite_table(suite, s) for suite, s in scores.items()))


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Register `replay score` on the `kbench` parser."""
    replay = subparsers.add_parser("replay", help="score forget operators' session files (docs/replay.md)")
    commands = replay.add_subparsers(dest="replay_command", metavar="COMMAND", required=True)
    score = commands.add_parser("score", help="exact, action and any leak, CAD, Leak@probes and cost of each "
                                "operator per suite, against the full reset B5")
    score.add_argument("files", nargs="+", metavar="FILE.jsonl")
    score.add_argument("--json", action="store_true", help="print one JSON object, keyed by suite")
    score.set_defaults(handler=run_score)
