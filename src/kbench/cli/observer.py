"""`kbench score`, `kbench verdict` and `kbench import-traces`: the observer's command line.

Scoring works on trace files alone, outside a project folder too. Bad input (unreadable
file, invalid record, inconsistent cells) is a one-line error and exit 2 (`kbench.cli`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kbench.config import DEFAULT_PARAMS, ScoringConfig, load_params
from kbench.io import write_jsonl
from kbench.observer.channels import CHANNELS
from kbench.observer.format import fmt_interval, fmt_number, fmt_rate
from kbench.observer.metrics import CellMetrics, score_queries, score_records
from kbench.observer.published import CellLabels, import_published
from kbench.observer.verdicts import CellQuartet, VerdictResult, compare_cells, verdicts_by_budget
from kbench.records import SPLITS, TraceRecord, read_traces


def _scoring_config(args: argparse.Namespace) -> ScoringConfig:
    """The `scoring` section of the params file (`kbench --params`, default params.yaml).

    Scoring must work on trace files alone, outside a project folder too: when the default
    params file is absent the SPEC values are used; a file named explicitly must exist.
    """
    path = Path(getattr(args, "params", DEFAULT_PARAMS))
    if path == Path(DEFAULT_PARAMS) and not path.exists():
        return ScoringConfig()
    return load_params(path).scoring


def _read(paths: Sequence[str]) -> list[TraceRecord]:
    records = read_traces(paths)
    if not records:
        raise ValueError(f"no trace records in {', '.join(paths)}")
    return records


def _print_json(data: dict[str, Any]) -> None:
    print(json.dumps(data, indent=2, allow_nan=False))


def metrics_table(metrics: CellMetrics) -> str:
    """The readable `kbench score` table."""
    ci = metrics.ci
    shares = metrics.shares or {}
    share_ci = ci.shares or {}
    lines = [
        f"n = {metrics.n}   OR(all) = {fmt_rate(metrics.or_all)} {fmt_interval(ci.or_all)}   "
        f"OR-graded = {fmt_rate(metrics.or_graded)}   degeneration = {fmt_rate(metrics.degeneration)}   "
        f"answer severity = {fmt_rate(metrics.answer_severity)}",
        f"{int(ci.level * 100)}% percentile bootstrap, B = {ci.resamples}, seed = {ci.seed}",
        "",
        f"{'channel':<12} {'observed':>8} {'CER':>6} {'CER CI':>16} {'share':>6} {'share CI':>16}",
    ]
    for channel in CHANNELS:
        lines.append(
            f"{channel:<12} {metrics.n_observed[channel]:>8} {fmt_rate(metrics.cer[channel]):>6} "
            f"{fmt_interval(ci.cer[channel]):>16} {fmt_rate(shares.get(channel)):>6} "
            f"{fmt_interval(share_ci.get(channel)):>16}"
        )
    lines += ["", "attacker budget  " + "  ".join(f"{k} {fmt_rate(v)}" for k, v in metrics.attacker_budget.items())]
    return "\n".join(lines)


def verdict_table(result: VerdictResult) -> str:
    """The readable `kbench verdict` listing."""
    data = result.to_json()
    return "\n".join(f"{key:<18} {fmt_number(v)}" for key, v in data.items())


def run_score(args: argparse.Namespace) -> None:
    metrics = score_records(_read(args.files), _scoring_config(args))
    if args.json:
        _print_json(metrics.to_json())
    else:
        print(metrics_table(metrics))


def run_verdict(args: argparse.Namespace) -> None:
    config = _scoring_config(args)
    quartet = CellQuartet(
        none_forget=score_queries(_read(args.none_forget), config.rule),
        none_retain=score_queries(_read(args.none_retain), config.rule),
        method_forget=score_queries(_read(args.method_forget), config.rule),
        method_retain=score_queries(_read(args.method_retain), config.rule),
    )
    result = compare_cells(quartet, config)
    by_budget = verdicts_by_budget(quartet, config) if args.by_budget else None
    if args.json:
        data = result.to_json()
        if by_budget is not None:
            data["by_budget"] = {budget: r.to_json() for budget, r in by_budget.items()}
        _print_json(data)
        return
    print(verdict_table(result))
    if by_budget is not None:
        print("\nby attacker budget: " + "  ".join(f"{b} {r.verdict}" for b, r in by_budget.items()))


def run_import(args: argparse.Namespace) -> None:
    labels = CellLabels(substrate=args.substrate, method=args.method, seed=args.seed, split=args.split)
    records = [record for path in args.files for record in import_published(path, labels)]
    if not records:
        raise ValueError(f"no transcripts in {', '.join(args.files)}")
    write_jsonl(args.out, records)
    print(f"wrote {len(records)} trace records to {args.out}", file=sys.stderr)


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Register `score`, `verdict` and `import-traces` on the `kbench` parser."""
    score = subparsers.add_parser("score", help="metrics of the trace records given, as one cell")
    score.add_argument("files", nargs="+", metavar="FILE.jsonl")
    score.add_argument("--json", action="store_true", help="print one JSON object")
    score.set_defaults(handler=run_score)

    verdict = subparsers.add_parser("verdict", help="a method's K-class verdict against `none`")
    for flag in ("--none-forget", "--none-retain", "--method-forget", "--method-retain"):
        verdict.add_argument(flag, nargs="+", required=True, metavar="FILE.jsonl")
    verdict.add_argument("--json", action="store_true", help="print one JSON object")
    verdict.add_argument("--by-budget", action="store_true", help="also give the verdict at A1..A5")
    verdict.set_defaults(handler=run_verdict)

    imported = subparsers.add_parser(
        "import-traces", help="convert published K-Bench release transcripts to trace records"
    )
    imported.add_argument("files", nargs="+", metavar="IN.jsonl")
    imported.add_argument("--out", required=True, metavar="OUT.jsonl")
    imported.add_argument("--substrate")
    imported.add_argument("--method")
    imported.add_argument("--seed", type=int)
    imported.add_argument("--split", choices=SPLITS)
    imported.set_defaults(handler=run_import)
