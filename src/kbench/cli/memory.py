"""`kbench memory score`: the memory lane's suite metrics of item files (SPEC §15, docs/memory.md).

Scoring works on item files alone. Bad input (an unreadable file, an invalid record, a probe
without its twin) is a one-line error and exit 2 (`kbench.cli`).
"""

from __future__ import annotations

import argparse
import json

from kbench.memory.records import read_items
from kbench.memory.scoring import DEFAULT_RESAMPLES, DEFAULT_SEED, METRICS, Estimate, SystemScores, score_records
from kbench.observer.format import fmt_interval, fmt_rate, fmt_with_ci

#: The title of these commands in `kbench --help`.
GROUP = "memory lane (item files of memory systems, docs/memory.md)"


#: Width of one metric's "value [low, high]" cell in the systems table.
CELL = 21


def _rows(title: str, estimates: dict[str, Estimate], level: float) -> list[str]:
    """One line per estimate: name, value, interval, n."""
    lines = [f"  {title:<12} {'value':>6} {f'{level:.0%} CI':>14} {'n':>6}"]
    for name, e in estimates.items():
        lines.append(f"  {name:<12} {fmt_rate(e.value):>6} {fmt_interval(e.ci):>14} {e.n:>6}")
    return lines


def scores_table(scores: dict[str, SystemScores]) -> str:
    """The readable `kbench memory score` listing: systems × metrics, then each system's breakdowns."""
    lines = [f"{'system':<16}" + "".join(f"{m:>{CELL}}" for m in METRICS)]
    for system, s in scores.items():
        lines.append(f"{system:<16}" + "".join(
            f"{fmt_with_ci(s.metrics[m].value, s.metrics[m].ci):>{CELL}}" for m in METRICS
        ))
    for system, s in scores.items():
        b = s.bootstrap
        lines += ["", f"{system}: {s.instances} instances; {b.level:.0%} percentile cluster bootstrap "
                      f"over instances, B = {b.resamples}, seed = {b.seed}"]
        lines += _rows("metric", s.metrics, b.level)
        lines += _rows("FE by type", s.fe_by_request_type, b.level)
        lines += _rows("AR by attack", s.ar_by_attack, b.level)
        for tier, metrics in s.by_tier.items():
            lines += _rows(f"tier {tier}", metrics, b.level)
    return "\n".join(lines)


def run_score(args: argparse.Namespace) -> None:
    records = read_items(args.files)
    if not records:
        raise ValueError(f"no item records in {', '.join(args.files)}")
    scores = score_records(records, resamples=args.resamples, seed=args.seed)
    if args.json:
        print(json.dumps({system: s.to_json() for system, s in scores.items()}, indent=2, allow_nan=False))
    else:
        print(scores_table(scores))


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Register `memory score` on the `kbench` parser."""
    memory = subparsers.add_parser("memory", help="score memory systems' item files (docs/memory.md)")
    commands = memory.add_subparsers(dest="memory_command", metavar="COMMAND", required=True)
    score = commands.add_parser("score", help="RA, FE, PR, RLA, AR, RPR and Score of each system in the files")
    score.add_argument("files", nargs="+", metavar="FILE.jsonl")
    score.add_argument("--json", action="store_true", help="print one JSON object, keyed by system")
    score.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES,
                       help="bootstrap resamples B (default: %(default)s)")
    score.add_argument("--seed", type=int, default=DEFAULT_SEED, help="bootstrap seed (default: %(default)s)")
    score.set_defaults(handler=run_score)
