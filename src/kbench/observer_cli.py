"""`kbench score`, `kbench verdict` and `kbench import-traces`: the observer's command line.

`add_subcommands(subparsers)` registers the three commands on the main `kbench` parser;
each sets `handler`, a function of the parsed arguments that returns the exit status. Bad
input (unreadable file, invalid record, inconsistent cells) prints one line naming the
problem to stderr and returns status 2; no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kbench.channels import CHANNELS
from kbench.config import ParamsError, ScoringConfig, load_params
from kbench.metrics import CellMetrics, Interval, score_queries, score_records
from kbench.published import CellLabels, PublishedFormatError, import_published
from kbench.records import SPLITS, TraceFormatError, TraceRecord, read_traces, write_jsonl
from kbench.verdicts import CellQuartet, VerdictResult, compare_cells, verdicts_by_budget

EXIT_BAD_INPUT = 2
#: The params file `kbench` reads unless `--params` names another (as in kbench.cli).
DEFAULT_PARAMS = "params.yaml"

#: Errors that mean "the input is wrong", reported as one line without a traceback.
_INPUT_ERRORS = (TraceFormatError, PublishedFormatError, ParamsError, ValueError, OSError)


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


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _fmt_interval(interval: Interval | None) -> str:
    return "-" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"


def metrics_table(metrics: CellMetrics) -> str:
    """The readable `kbench score` table."""
    ci = metrics.ci
    shares = metrics.shares or {}
    share_ci = ci.shares or {}
    lines = [
        f"n = {metrics.n}   OR(all) = {_fmt(metrics.or_all)} {_fmt_interval(ci.or_all)}   "
        f"OR-graded = {_fmt(metrics.or_graded)}   degeneration = {_fmt(metrics.degeneration)}   "
        f"answer severity = {_fmt(metrics.answer_severity)}",
        f"{int(ci.level * 100)}% percentile bootstrap, B = {ci.resamples}, seed = {ci.seed}",
        "",
        f"{'channel':<12} {'observed':>8} {'CER':>6} {'CER CI':>16} {'share':>6} {'share CI':>16}",
    ]
    for channel in CHANNELS:
        lines.append(
            f"{channel:<12} {metrics.n_observed[channel]:>8} {_fmt(metrics.cer[channel]):>6} "
            f"{_fmt_interval(ci.cer[channel]):>16} {_fmt(shares.get(channel)):>6} "
            f"{_fmt_interval(share_ci.get(channel)):>16}"
        )
    lines += ["", "attacker budget  " + "  ".join(f"{k} {_fmt(v)}" for k, v in metrics.attacker_budget.items())]
    return "\n".join(lines)


def verdict_table(result: VerdictResult) -> str:
    """The readable `kbench verdict` listing."""
    data = result.to_json()
    return "\n".join(f"{key:<18} {f'{v:.4g}' if isinstance(v, float) else v}" for key, v in data.items())


def run_score(args: argparse.Namespace) -> None:
    metrics = score_records(_read(args.files), _scoring_config(args))
    if args.json:
        _print_json(metrics.to_json())
    else:
        print(metrics_table(metrics))


def run_verdict(args: argparse.Namespace) -> None:
    config = _scoring_config(args)
    quartet = CellQuartet(
        none_forget=score_queries(_read(args.none_forget)),
        none_retain=score_queries(_read(args.none_retain)),
        method_forget=score_queries(_read(args.method_forget)),
        method_retain=score_queries(_read(args.method_retain)),
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


def _guarded(run: Callable[[argparse.Namespace], None]) -> Callable[[argparse.Namespace], int]:
    """Turn bad input into one line on stderr and exit status 2 instead of a traceback."""

    def handler(args: argparse.Namespace) -> int:
        try:
            run(args)
        except _INPUT_ERRORS as exc:
            print(f"kbench {args.command}: error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return 0

    return handler


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Register `score`, `verdict` and `import-traces` on the `kbench` parser."""
    score = subparsers.add_parser("score", help="metrics of the trace records given, as one cell")
    score.add_argument("files", nargs="+", metavar="FILE.jsonl")
    score.add_argument("--json", action="store_true", help="print one JSON object")
    score.set_defaults(handler=_guarded(run_score), command="score")

    verdict = subparsers.add_parser("verdict", help="a method's K-class verdict against `none`")
    for flag in ("--none-forget", "--none-retain", "--method-forget", "--method-retain"):
        verdict.add_argument(flag, nargs="+", required=True, metavar="FILE.jsonl")
    verdict.add_argument("--json", action="store_true", help="print one JSON object")
    verdict.add_argument("--by-budget", action="store_true", help="also give the verdict at A1..A5")
    verdict.set_defaults(handler=_guarded(run_verdict), command="verdict")

    imported = subparsers.add_parser(
        "import-traces", help="convert published K-Bench release transcripts to trace records"
    )
    imported.add_argument("files", nargs="+", metavar="IN.jsonl")
    imported.add_argument("--out", required=True, metavar="OUT.jsonl")
    imported.add_argument("--substrate")
    imported.add_argument("--method")
    imported.add_argument("--seed", type=int)
    imported.add_argument("--split", choices=SPLITS)
    imported.set_defaults(handler=_guarded(run_import), command="import-traces")


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point (`python -m kbench.observer_cli ...`)."""
    parser = argparse.ArgumentParser(prog="kbench", description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=DEFAULT_PARAMS, help="params file (default: %(default)s)")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
