"""The execution-state lane's results page (`replay.results`, docs/results-replay.md by default),
written by the `replay` stage from the suites' scores: the paper's Table 1 shape (operators ×
suites: any leak, CAD, recomputed tokens), its Table 2 shape (Leak@probes), and the exactness
counts. Pure: scores in, Markdown out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kbench.observer.format import fmt_rate
from kbench.replay.records import OPERATORS


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _count(counts: Mapping[str, int] | None, key: str) -> str:
    return "-" if not counts else f"{counts[key]}/{counts['sessions']}"


def render_results(scores: Mapping[str, Mapping[str, Any]], *, model: str, params_digest: str) -> str:
    """The page for `scores` ({suite: `score_suite` output plus `not_entered`})."""
    suites = list(scores)
    lines = [
        "# Execution-state lane: results",
        "",
        f"Written by the `replay` stage (docs/replay.md) for model `{model}`, replay params digest "
        f"`{params_digest}`. Each cell is a mean over the suite's sessions; every operator is read "
        "against the full reset B5 (SPEC §14). Do not edit: rerun `dvc repro replay`.",
        "",
        "## Table 1: leaks and cost",
        "",
        "any = exact or action leak; CAD = call-argument distance to B5; tokens = recomputed tokens (the "
        "operator's own work).",
        "",
        "| operator | " + " | ".join(f"{s}: any | CAD | tokens" for s in suites) + " |",
        "|---|" + "---:|---:|---:|" * len(suites),
    ]
    for operator in OPERATORS:
        cells = []
        for suite in suites:
            row = scores[suite]["operators"].get(operator)
            cells += ["-", "-", "-"] if row is None else [fmt_rate(row["any"]), f"{row['cad']:.3f}",
                                                          f"{row['recomputed_tokens']:.0f}"]
        if any(c != "-" for c in cells):
            lines.append(f"| {operator} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Table 2: probes",
        "",
        "Leak@probes: some kept probe's reply holds z (a probe on which B5 leaks is dropped for the suite). "
        "p: exact McNemar against B5, Benjamini-Hochberg over the suite's operators.",
        "",
        "| operator | " + " | ".join(f"{s}: Leak@probes | p (any) | p (probes)" for s in suites) + " |",
        "|---|" + "---:|---:|---:|" * len(suites),
    ]
    for operator in OPERATORS:
        cells = []
        for suite in suites:
            row = scores[suite]["operators"].get(operator)
            tests = (scores[suite].get("tests") or {}).get(operator)
            if row is None:
                cells += ["-", "-", "-"]
                continue
            cells += [fmt_rate(row["leak_at_probes"]),
                      _p(tests["mcnemar_any"]["p_adj"]) if tests else "-",
                      _p(tests["mcnemar_leak_at_probes"]["p_adj"]) if tests else "-"]
        if any(c != "-" for c in cells):
            lines.append(f"| {operator} | " + " | ".join(cells) + " |")
    lines += ["", "## Exactness and savings", "",
              "| suite | sessions | valid | B7 = B5 | B7 at T - tau + 1 | B1 = B0 | savings | bound | kept probes | "
              "z never entered |",
              "|---|---:|---|---:|---:|---:|---:|---:|---|---|"]
    for suite in suites:
        s = scores[suite]
        savings = "-" if s["savings"] is None else f"{s['savings']:.2f}x"
        bound = "-" if s["bound"] is None else f"{s['bound']:.2f}x"
        lines.append(
            f"| {suite} | {s['sessions']} | {'yes' if s['valid'] else 'no'} | {_count(s['b7_equals_b5'], 'equal')} | "
            f"{_count(s['b7_transitions_at_bound'], 'at_bound')} | {_count(s.get('b1_equals_b0'), 'equal')} | "
            f"{savings} | {bound} | {', '.join(s['kept_probes']) or '-'} | "
            f"{', '.join(s.get('not_entered') or []) or '-'} |")
    return "\n".join(lines) + "\n"
