"""`kbench score`, `kbench verdict`, `kbench diff`, `kbench import-traces` and `kbench power`: the observer's command line.

Scoring works on trace files alone, outside a project folder too. Bad input (unreadable
file, invalid record, inconsistent cells) is a one-line error and exit 2 (`kbench.cli`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kbench.config import DEFAULT_PARAMS, ScoringConfig, load_params
from kbench.io import write_jsonl
from kbench.observer.channels import CHANNELS
from kbench.observer.diff import Piece, TraceDiff, diff_traces, find_record
from kbench.observer.format import fmt_interval, fmt_number, fmt_p, fmt_rate
from kbench.observer.metrics import CellMetrics, cell_metrics, score_queries
from kbench.observer.taxonomy import NameIndex
from kbench.observer.power import PairedDesign, exact_power, n_per_seed_needed, simulated_power, smallest_p
from kbench.observer.published import CellLabels, import_published
from kbench.observer.verdicts import (
    K_REF,
    K_REF_INF,
    CellQuartet,
    VerdictResult,
    compare_cells,
    reachable_classes,
    verdicts_by_budget,
)
from kbench.names import BASELINE_METHOD
from kbench.corpus import corpus_names
from kbench.records import FORGET, RETAIN, SPLITS, TraceRecord, read_traces

#: The title of these commands in `kbench --help`.
GROUP = "scoring (trace files alone, outside a project folder too)"


def _scoring_config(args: argparse.Namespace) -> ScoringConfig:
    """The `scoring` section of the params file (`kbench --params`, default params.yaml).

    Scoring must work on trace files alone, outside a project folder too: when the default
    params file is absent the defaults are used; a file named explicitly must exist.
    """
    path = Path(getattr(args, "params", DEFAULT_PARAMS))
    if path == Path(DEFAULT_PARAMS) and not path.exists():
        return ScoringConfig()
    return load_params(path).scoring


def _read(paths: Sequence[str], *, split: str | None = None) -> list[TraceRecord]:
    """The records of `paths` (of `split` only, when given); a (seed, query) twice is an error."""
    records, seen = [], {}
    for path in paths:
        for record in read_traces([path]):
            if split is not None and record.split != split:
                continue
            key = (record.seed, record.query_id)
            if key in seen:
                where = f"twice in {path}" if seen[key] == path else f"in {seen[key]} and {path}"
                raise ValueError(f"query {record.query_id} of seed {record.seed} appears {where}: a cell "
                                 "scores each query once (remove the repeat)")
            seen[key] = path
            records.append(record)
    if not records:
        raise ValueError(f"no trace records{f' of split {split}' if split else ''} in {', '.join(paths)}")
    return records


def _mixture(records: Sequence[TraceRecord]) -> list[str]:
    """What `records` pool that one cell does not: several substrates, methods or splits."""
    mixed = []
    for label in ("substrate", "method", "split"):
        values = sorted({getattr(r, label) for r in records})
        if len(values) > 1:
            mixed.append(f"{len(values)} {label}s ({', '.join(values)})")
    return mixed


def _warn_if_mixed(records: Sequence[TraceRecord], args: argparse.Namespace) -> None:
    mixed = _mixture(records)
    if mixed and not args.allow_mixed:
        print(f"kbench {args.command}: warning: pooling {' and '.join(mixed)} into one OR; --split scores "
              "one split, --allow-mixed pools on purpose", file=sys.stderr)


#: `kbench verdict`'s file roles: (flag destination, method label expected, split).
VERDICT_ROLES = (
    ("none_forget", True, FORGET), ("none_retain", True, RETAIN),
    ("method_forget", False, FORGET), ("method_retain", False, RETAIN),
)


def _role_records(args: argparse.Namespace, dest: str, baseline: bool, split: str) -> list[TraceRecord]:
    """A verdict role's records, refused when their method or split label is another role's."""
    paths = getattr(args, dest)
    records = _read(paths)
    flag = "--" + dest.replace("_", "-")
    for record in records:
        if (record.method == BASELINE_METHOD) != baseline:
            wanted = f"method {BASELINE_METHOD}" if baseline else f"a method other than {BASELINE_METHOD}"
            raise ValueError(f"{flag}: {', '.join(paths)} holds records of method {record.method} "
                             f"({record.query_id}); this role takes {wanted}")
        if record.split != split:
            raise ValueError(f"{flag}: {', '.join(paths)} holds {record.split} records ({record.query_id}); "
                             f"this role takes the {split} split")
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
    lines += ["failure modes    " + "  ".join(f"{k} {v}" for k, v in metrics.failure_modes.items())]
    return "\n".join(lines)


def verdict_table(result: VerdictResult) -> str:
    """The readable `kbench verdict` listing."""
    data = result.to_json()
    return "\n".join(f"{key:<18} {fmt_number(v)}" for key, v in data.items())


def _names(args: argparse.Namespace) -> NameIndex | None:
    return None if args.corpus is None else corpus_names(Path(args.corpus), required=True)


def run_score(args: argparse.Namespace) -> None:
    records = _read(args.files, split=args.split)
    _warn_if_mixed(records, args)
    config = _scoring_config(args)
    metrics = cell_metrics(score_queries(records, config.rule, _names(args)), config)
    if args.json:
        _print_json({**metrics.to_json(), "failure_modes": metrics.failure_modes})
    else:
        print(metrics_table(metrics))


def run_verdict(args: argparse.Namespace) -> None:
    config = _scoring_config(args)
    names = _names(args)
    quartet = CellQuartet(**{
        dest: score_queries(_role_records(args, dest, baseline, split), config.rule, names)
        for dest, baseline, split in VERDICT_ROLES
    })
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


#: How `kbench diff` marks the ground truth: plain brackets, or bold red on a terminal.
_MARKS = {False: ("«", "»"), True: ("\033[1;31m", "\033[0m")}


def _marked(piece: Piece | None, color: bool) -> str:
    if piece is None:
        return ""
    if piece.text is None:
        return "(dropped)"
    opening, closing = _MARKS[color]
    return "".join(f"{opening}{text}{closing}" if hit else text for text, hit in piece.segments()) or "(empty)"


def diff_text(diff: TraceDiff, width: int = 120, color: bool = False) -> str:
    """`kbench diff`'s listing: a header per side, then every piece of both trajectories in
    two columns, the ground truth marked «like this» (in colour on a terminal)."""
    label_width = 26
    column = max(20, (width - label_width - 6) // 2)
    before, after = diff.before, diff.after

    def line(label: str, left: str, right: str) -> list[str]:
        lefts = [w for part in left.splitlines() or [""] for w in textwrap.wrap(part, column) or [""]]
        rights = [w for part in right.splitlines() or [""] for w in textwrap.wrap(part, column) or [""]]
        out = []
        for i in range(max(len(lefts), len(rights))):
            a = lefts[i] if i < len(lefts) else ""
            b = rights[i] if i < len(rights) else ""
            out.append(f"{label if i == 0 else '':<{label_width}} | {a:<{column}} | {b}".rstrip())
        return out

    lines = [f"query {before.query_id} (seed {before.seed}, {before.split}); ground truth: {before.ground_truth}"]
    lines += line("method", before.method, after.method)
    lines += line("halted / failure mode", f"{before.halted_reason} / {before.failure_mode or 'healthy'}",
                  f"{after.halted_reason} / {after.failure_mode or 'healthy'}")
    lines += line("leaking channels", ", ".join(before.leaked) or "no channel", ", ".join(after.leaked) or "no channel")
    if diff.migrated:
        lines.append(f"leak moved: {', '.join(diff.lost)} -> {', '.join(diff.gained)}")
    lines.append("-" * min(width, label_width + 2 * column + 6))
    for label, left, right in diff.rows():
        channel = (left or right).channel
        lines += line(f"{label} ({channel})", _marked(left, False), _marked(right, False))
    text = "\n".join(lines)
    if color:
        for plain, ansi in zip(_MARKS[False], _MARKS[True]):
            text = text.replace(plain, ansi)
    return text


def run_diff(args: argparse.Namespace) -> None:
    config = _scoring_config(args)
    found = []
    for path in (args.before, args.after):
        record = find_record(read_traces([path]), args.query, args.seed)
        if record is None:
            seed = "" if args.seed is None else f" of seed {args.seed}"
            raise ValueError(f"{path} has no trace record of query {args.query}{seed}")
        found.append(record)
    diff = diff_traces(*found, config.rule, _names(args))
    width = shutil.get_terminal_size((120, 24)).columns
    print(diff_text(diff, width, color=not args.no_color and sys.stdout.isatty()))


def run_import(args: argparse.Namespace) -> None:
    labels = CellLabels(substrate=args.substrate, method=args.method, seed=args.seed, split=args.split)
    records = [record for path in args.files for record in import_published(path, labels)]
    if not records:
        raise ValueError(f"no transcripts in {', '.join(args.files)}")
    write_jsonl(args.out, records)
    print(f"wrote {len(records)} trace records to {args.out}", file=sys.stderr)


def power_report(design: PairedDesign, config: ScoringConfig, simulations: int | None, seed: int) -> dict[str, Any]:
    """`kbench power --json`: the design, the paired model, the power and what the n allows."""
    baseline_only, method_only = design.discordant
    exact = simulations is None
    power = exact_power(design) if exact else simulated_power(design, simulations, seed)
    lowest = smallest_p(design.pairs)
    return {
        "n": design.n,
        "seeds": design.seeds,
        "pairs": design.pairs,
        "or_none": design.or_none,
        "or_method": design.or_method,
        "relative_reduction": design.relative_reduction,
        "rho": design.rho,
        "alpha": design.alpha,
        "p_baseline_only": baseline_only,
        "p_method_only": method_only,
        "power": power,
        "method": "exact" if exact else f"simulation ({simulations} draws, seed {seed})",
        "smallest_p": lowest,
        "reachable_classes": list(reachable_classes(lowest, config)),
        "n_per_seed_needed": {
            K_REF: n_per_seed_needed(config.significance, design.seeds),
            K_REF_INF: n_per_seed_needed(config.kref_inf_p, design.seeds),
        },
    }


def power_text(report: dict[str, Any]) -> str:
    """The readable `kbench power` listing."""
    needed = report["n_per_seed_needed"]
    return "\n".join([
        f"paired McNemar, exact two-sided, rejecting at p < {report['alpha']:g}",
        f"design: {report['n']} queries per split x {report['seeds']} seed(s) = {report['pairs']} pairs",
        f"model: OR none {report['or_none']:g}, OR method {report['or_method']:.4g} "
        f"({report['relative_reduction']:.0%} lower), rho {report['rho']:g}: "
        f"P(baseline only) {report['p_baseline_only']:.4g}, P(method only) {report['p_method_only']:.4g}",
        f"power: {fmt_rate(report['power'])} ({report['method']})",
        f"smallest p with {report['pairs']} pairs: {fmt_p(report['smallest_p'])}; "
        f"reachable K-classes: {', '.join(report['reachable_classes'])}",
        f"with {report['seeds']} seed(s), {K_REF} needs n >= {needed[K_REF]} per seed and "
        f"{K_REF_INF} n >= {needed[K_REF_INF]}",
    ])


def run_power(args: argparse.Namespace) -> None:
    config = _scoring_config(args)
    design = PairedDesign(
        n=args.n, seeds=args.seeds, or_none=args.or_none, relative_reduction=args.relative_reduction,
        rho=args.rho, alpha=config.significance if args.alpha is None else args.alpha,
    )
    report = power_report(design, config, args.simulations, args.seed)
    if args.json:
        _print_json(report)
    else:
        print(power_text(report))


CORPUS_HELP = "the corpus folder (artifacts/corpus): its names let the failure modes tell a name binding"


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Register `score`, `verdict`, `diff`, `import-traces` and `power` on the `kbench` parser."""
    score = subparsers.add_parser("score", help="metrics of the trace records given, as one cell")
    score.add_argument("files", nargs="+", metavar="FILE.jsonl")
    score.add_argument("--json", action="store_true", help="print one JSON object")
    score.add_argument("--split", choices=SPLITS, help="score the records of this split only")
    score.add_argument("--allow-mixed", action="store_true",
                       help="pool several substrates, methods or splits without a warning")
    score.add_argument("--corpus", metavar="DIR", help=CORPUS_HELP)
    score.set_defaults(handler=run_score)

    verdict = subparsers.add_parser("verdict", help="a method's K-class verdict against `none`")
    for flag in ("--none-forget", "--none-retain", "--method-forget", "--method-retain"):
        verdict.add_argument(flag, nargs="+", required=True, metavar="FILE.jsonl")
    verdict.add_argument("--json", action="store_true", help="print one JSON object")
    verdict.add_argument("--by-budget", action="store_true", help="also give the verdict at A1..A5")
    verdict.add_argument("--corpus", metavar="DIR", help=CORPUS_HELP)
    verdict.set_defaults(handler=run_verdict)

    diff = subparsers.add_parser("diff", help="two trajectories of one query side by side, the ground truth marked")
    diff.add_argument("before", metavar="A.jsonl", help="trace records of one side (e.g. the baseline's cell)")
    diff.add_argument("after", metavar="B.jsonl", help="trace records of the other (e.g. a method's cell)")
    diff.add_argument("--query", required=True, metavar="ID", help="the query id (e.g. pii-00003::occupation)")
    diff.add_argument("--seed", type=int, help="the seed, when a file holds several (default: the smallest)")
    diff.add_argument("--corpus", metavar="DIR", help=CORPUS_HELP)
    diff.add_argument("--no-color", action="store_true", help="mark the ground truth «like this» even on a terminal")
    diff.set_defaults(handler=run_diff)

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

    power = subparsers.add_parser(
        "power", help="power of the paired McNemar test for a planned design (docs/observer.md)"
    )
    power.add_argument("--n", type=int, required=True, help="queries per split and seed")
    power.add_argument("--seeds", type=int, required=True, help="seeds pooled")
    power.add_argument("--or-none", type=float, required=True, help="baseline leak probability (OR(all))")
    power.add_argument("--relative-reduction", type=float, required=True,
                       help="the method leaks or_none x (1 - this)")
    power.add_argument("--rho", type=float, required=True,
                       help="correlation of a pair's two leak indicators")
    power.add_argument("--alpha", type=float, default=None,
                       help="level of the test (default: scoring.significance of the params file)")
    power.add_argument("--simulations", type=int, default=None,
                       help="estimate by this many seeded draws instead of the exact sum")
    power.add_argument("--seed", type=int, default=0, help="seed of the simulation (default: %(default)s)")
    power.add_argument("--json", action="store_true", help="print one JSON object")
    power.set_defaults(handler=run_power)
