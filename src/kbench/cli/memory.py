"""`kbench memory score`: the memory lane's probe-family metrics of item files (docs/memory.md);
`kbench memory judge`: an endpoint judge's agreement with the matcher on a sample of them.

Scoring works on item files alone. Bad input (an unreadable file, an invalid record, a probe
without its twin) is a one-line error and exit 2 (`kbench.cli`).
"""

from __future__ import annotations

import argparse
import json

from kbench.backends import build_backend
from kbench.backends.openai import OpenAIBackend
from kbench.config import ModelConfig
from kbench.memory.judge import agreement, judge_items, sample_items
from kbench.memory.records import read_items
from kbench.memory.scoring import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    METRICS,
    Estimate,
    SystemScores,
    design_validity,
    score_items,
)
from kbench.observer.format import fmt_interval, fmt_rate, fmt_with_ci

#: The title of these commands in `kbench --help`.
GROUP = "memory lane (item files of memory systems, docs/memory.md)"


#: Width of one metric's "value [low, high]" cell in the systems table.
CELL = 21
#: The validity gate's verdict in the listing's last line.
VERDICT: dict[bool | None, str] = {True: "valid", False: "NOT VALID", None: "validity unknown"}



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
        lines += _rows("RA by type", s.ra_by_request_type, b.level)
        lines += _rows("RLA by type", s.rla_by_request_type, b.level)
        lines += _rows("AR by type", s.ar_by_request_type, b.level)
        lines += _rows("AR by attack", s.ar_by_attack, b.level)
        for tier, metrics in s.by_tier.items():
            lines += _rows(f"tier {tier}", metrics, b.level)
    verdict = design_validity(scores)
    lines += ["", f"design: {VERDICT[verdict.valid]}: {verdict.reason}"]
    return "\n".join(lines)


def run_score(args: argparse.Namespace) -> None:
    records = read_items(args.files)
    if not records:
        raise ValueError(f"no item records in {', '.join(args.files)}")
    scores = score_items(records, resamples=args.resamples, seed=args.seed)
    if args.json:
        # the design's validity gate (docs/memory.md, "The validity gate") rides in every system's entry
        verdict = design_validity(scores)
        print(json.dumps({system: {**s.to_json(), "valid": verdict.valid, "validity_reason": verdict.reason}
                          for system, s in scores.items()}, indent=2, allow_nan=False))
    else:
        print(scores_table(scores))


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Register `memory score` and `memory judge` on the `kbench` parser."""
    memory = subparsers.add_parser("memory", help="score or judge memory systems' item files (docs/memory.md)")
    commands = memory.add_subparsers(dest="memory_command", metavar="COMMAND", required=True)
    score = commands.add_parser("score", help="RA, FE, PR, RLA, AR, RPR and Score of each system in the files")
    score.add_argument("files", nargs="+", metavar="FILE.jsonl")
    score.add_argument("--json", action="store_true", help="print one JSON object, keyed by system")
    score.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES,
                       help="bootstrap resamples B (default: %(default)s)")
    score.add_argument("--seed", type=int, default=DEFAULT_SEED, help="bootstrap seed (default: %(default)s)")
    score.set_defaults(handler=run_score)
    judge = commands.add_parser(
        "judge", help="an LLM judge on a sample of probe replies, and its agreement with the matcher")
    judge.add_argument("files", nargs="+", metavar="FILE.jsonl")
    judge.add_argument("--base-url", required=True, help="the judge's OpenAI-compatible endpoint (…/v1)")
    judge.add_argument("--model", required=True, help="the judge model's name at that endpoint")
    judge.add_argument("--api-key-env", default="OPENAI_API_KEY",
                       help="environment variable holding the endpoint's API key (default: %(default)s)")
    judge.add_argument("--sample", type=int, default=200, help="replies judged, drawn at random (default: %(default)s)")
    judge.add_argument("--seed", type=int, default=DEFAULT_SEED, help="the sample's seed (default: %(default)s)")
    judge.add_argument("--json", action="store_true", help="print one JSON object, keyed by system")
    judge.set_defaults(handler=run_judge)


def run_judge(args: argparse.Namespace) -> int:
    """Judge a seeded sample of each system's replies; print the agreement per system."""
    if args.sample < 1:
        raise ValueError(f"--sample must be at least 1, not {args.sample}")
    records = read_items(args.files)
    backend = build_backend(ModelConfig(backend=OpenAIBackend.name, path=args.model, base_url=args.base_url,
                                        api_key_env=args.api_key_env))
    report = {}
    for system in sorted({r.system for r in records}):
        sample = sample_items([r for r in records if r.system == system], args.sample, args.seed)
        report[system] = agreement(*judge_items(backend, sample)).to_json()
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    print(f"{'system':<16} {'n':>5} {'unread':>6} {'agree':>6} {'kappa':>6} {'both':>5} {'matcher':>7} {'judge':>5} "
          f"{'neither':>7}")
    for system, row in report.items():
        print(f"{system:<16} {row['n']:>5} {row['unreadable']:>6} {fmt_rate(row['agreement']):>6} "
              f"{fmt_rate(row['kappa']):>6} {row['both']:>5} {row['matcher_only']:>7} {row['judge_only']:>5} "
              f"{row['neither']:>7}")
    return 0
