"""The execution-state lane's results page (`replay.results`, docs/results-replay.md by default),
written by the `replay` stage from the suites' scores: the paper's Table 1 shape (operators ×
the suites of `replay.suites`: any leak, CAD, recomputed tokens), its Table 2 shape
(Leak@probes), the smallest p each suite's sessions allow (and, in bold at the top, the suites
where no test can be significant), the sweeps (theirs and, one row per variant and operator,
Tables 1 and 2 of each variant) and the exactness counts with B7's savings against B5 and B5′.
Pure: scores in, Markdown out."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from scipy.stats import linregress

from kbench.comparison.report import markdown_table
from kbench.comparison.tables import Table
from kbench.observer.format import fmt_rate
from kbench.replay.records import FULL_RESET, SELECTIVE_REPLAY, operator_order
from kbench.replay.scoring import SIGNIFICANCE


def _p(value: float | None) -> str:
    return _num(value, ".3g")


def _count(counts: Mapping[str, int] | None, key: str) -> str:
    return "-" if not counts else f"{counts[key]}/{counts['sessions']}"


def _fit(xs: list[float], ys: list[float]) -> dict[str, float | None]:
    """Least-squares line through the points: slope, intercept and R² (None with fewer than 3 points)."""
    if len(xs) < 3 or len(set(xs)) < 2:
        return {"slope": None, "intercept": None, "r2": None}
    fit = linregress(xs, ys)
    r2 = None if np.isnan(fit.rvalue) else float(fit.rvalue ** 2)
    return {"slope": float(fit.slope), "intercept": float(fit.intercept), "r2": r2}


def sweep_summary(suite: str, scores: Mapping[str, Mapping[str, Any]], *, tau: int | None = None,
                  indep: float | None = None) -> dict[str, Any] | None:
    """The suite's sweeps: per τ, B7's and B5's mean recomputed tokens with a line through each
    (B7's cost falls linearly in τ, B5's stays flat); per `indep`, each operator's any-leak rate.
    The suite's own run is a point of a sweep that ran, at its configured `tau` and `indep`."""
    summary: dict[str, Any] = {}

    def swept(key: str, value: float | None, cast: type) -> list[tuple[Any, Mapping[str, Any]]]:
        found = {cast(label.split("=", 1)[1]): s for label, s in scores.items() if label.startswith(f"{suite}@{key}=")}
        if found and value is not None and suite in scores:
            found.setdefault(cast(value), scores[suite])
        return sorted(found.items(), key=lambda pair: pair[0])

    taus = swept("tau", tau, int)
    if taus:
        points = [(t, s["operators"].get("B7", {}).get("recomputed_tokens"), s["operators"].get("B5", {})
                   .get("recomputed_tokens")) for t, s in taus]
        kept = [(t, b7, b5) for t, b7, b5 in points if b7 is not None and b5 is not None]
        summary["tau"] = {
            "points": [{"tau": t, "b7_tokens": b7, "b5_tokens": b5} for t, b7, b5 in kept],
            "b7_fit": _fit([t for t, _, _ in kept], [b7 for _, b7, _ in kept]),
            "b5_fit": _fit([t for t, _, _ in kept], [b5 for _, _, b5 in kept]),
        }
    indeps = swept("indep", indep, float)
    if indeps:
        summary["indep"] = [{"indep": v, "any": {op: row["any"] for op, row in s["operators"].items()}}
                            for v, s in indeps]
    granular = [s for label, s in scores.items() if label.startswith(f"{suite}@checkpoints=")]
    if granular and suite in scores:
        summary["checkpoints"] = [_granularity_row(s) for s in [scores[suite], *granular]]
    return summary or None


def _granularity_row(scores: Mapping[str, Any]) -> dict[str, Any]:
    """One granularity's B7 (leaks, cost, exactness against B5) and what its checkpoints cost."""
    costs = scores.get("checkpoints") or {}
    b7, b5 = scores["operators"].get(SELECTIVE_REPLAY, {}), scores["operators"].get(FULL_RESET, {})
    return {"granularity": costs.get("granularity"), "b7_any": b7.get("any"), "b7_cad": b7.get("cad"),
            "b7_transitions": b7.get("transitions"), "b7_tokens": b7.get("recomputed_tokens"),
            "b5_tokens": b5.get("recomputed_tokens"), "b7_equals_b5": scores.get("b7_equals_b5"),
            "checkpoints": costs.get("checkpoints"),
            "retained_bytes": costs.get("retained_bytes"), "metadata_bytes": costs.get("metadata_bytes")}


def render_no_suites(model: str) -> str:
    """The page of a design whose `replay.suites` is empty (DVC still expects the page)."""
    return ("# Execution-state lane: results\n\n"
            f"Written by the `replay` stage (docs/replay.md) for model `{model}`: no suite ran, `replay.suites` "
            "is empty in this design's params.\n")


def _is_variant(label: str) -> bool:
    """A sweep's variant (`<suite>@<key>=<value>`, `ReplayConfig.variants`), not a suite of `replay.suites`."""
    return "@" in label


def _configured(scores: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return [suite for suite in scores if not _is_variant(suite)]


def _per_operator(scores: Mapping[str, Mapping[str, Any]], suites: list[str],
                  cells: Callable[[Mapping[str, Any], str], list[str]]) -> tuple[tuple[str, ...], ...]:
    """One row per operator that some suite ran: its cells in each suite in turn."""
    rows = []
    for operator in sorted({o for suite in suites for o in scores[suite]["operators"]}, key=operator_order):
        row = [c for suite in suites for c in cells(scores[suite], operator)]
        if any(c != "-" for c in row):
            rows.append((operator, *row))
    return tuple(rows)


_COST = ("any", "CAD", "tokens")
_COST_NOTE = ("any = exact or action leak; CAD = call-argument distance to B5; tokens = recomputed tokens "
              "(the operator's own work). Each cell is a mean over the suite's sessions.")
_PROBES = ("Leak@probes", "Leak@k", "p (any)", "p (probes)")
_PROBES_NOTE = ("Leak@probes: some kept probe's reply holds z (a probe on which B5 leaks is dropped for the suite); "
                "Leak@k: some of k replies sampled per kept probe does (- when `replay.leak_at_k` is 0). "
                "p: exact McNemar against B5, Benjamini-Hochberg over the suite's operators (the least each suite's "
                "sessions allow is in the table \"Reach of the tests\").")


def _cost(entry: Mapping[str, Any], operator: str) -> list[str]:
    """Table 1's cells of one operator in one suite (dashes where it did not run)."""
    row = entry["operators"].get(operator)
    return ["-", "-", "-"] if row is None else [fmt_rate(row["any"]), f"{row['cad']:.3f}",
                                                f"{row['recomputed_tokens']:.0f}"]


def _probes(entry: Mapping[str, Any], operator: str) -> list[str]:
    """Table 2's cells of one operator in one suite (dashes where it did not run)."""
    row, tests = entry["operators"].get(operator), (entry.get("tests") or {}).get(operator)
    if row is None:
        return ["-", "-", "-", "-"]
    return [fmt_rate(row["leak_at_probes"]), "-" if row.get("leak_at_k") is None else fmt_rate(row["leak_at_k"]),
            _p(tests["mcnemar_any"]["p_adj"]) if tests else "-",
            _p(tests["mcnemar_leak_at_probes"]["p_adj"]) if tests else "-"]


def _table1(scores: Mapping[str, Mapping[str, Any]]) -> Table:
    suites = _configured(scores)
    return Table("Table 1: leaks and cost", ("Operator", *(f"{s}: {c}" for s in suites for c in _COST)),
                 _per_operator(scores, suites, _cost), _COST_NOTE)


def _table2(scores: Mapping[str, Mapping[str, Any]]) -> Table:
    suites = _configured(scores)
    return Table("Table 2: probes", ("Operator", *(f"{s}: {c}" for s in suites for c in _PROBES)),
                 _per_operator(scores, suites, _probes), _PROBES_NOTE)


def _variants_table(scores: Mapping[str, Mapping[str, Any]]) -> list[Table]:
    """Tables 1 and 2 of every sweep variant, one row per (variant, operator): the sweeps' own
    tables above keep only what each sweep is about."""
    variants = [suite for suite in scores if _is_variant(suite)]
    rows = tuple((variant, operator, *_cost(scores[variant], operator), *_probes(scores[variant], operator))
                 for variant in variants for operator in sorted(scores[variant]["operators"], key=operator_order))
    if not rows:
        return []
    return [Table("Sweep variants: leaks, cost and probes", ("Variant", "Operator", *_COST, *_PROBES), rows,
                  f"The columns of Tables 1 and 2 for each variant a sweep ran. {_COST_NOTE} {_PROBES_NOTE}")]


def _channel_tables(scores: Mapping[str, Mapping[str, Any]]) -> list[Table]:
    found = []
    for suite, entry in scores.items():
        channels = entry.get("channels") or {}
        if not channels:
            continue
        names = [c for c in next(iter(channels.values())) if c != "turns"]
        rows = tuple((operator, str(row["turns"]), *("-" if row[c] is None else fmt_rate(row[c]) for c in names))
                     for operator, row in channels.items())
        found.append(Table(f"Channels: {suite}", ("Operator", "turns", *names), rows,
                           "Beyond the paper: the post-revocation turns read as trace records by the six-channel "
                           "observer (docs/definitions.md); each cell is the fraction of turns whose channel holds z."))
    return found


def _sweep_tables(sweeps: Mapping[str, Mapping[str, Any]]) -> list[Table]:
    found = []
    for suite, summary in sweeps.items():
        if "tau" in summary:
            b7, b5 = summary["tau"]["b7_fit"], summary["tau"]["b5_fit"]
            found.append(Table(
                f"τ sweep: {suite}", ("τ", "B7", "B5"),
                tuple((str(p["tau"]), f"{p['b7_tokens']:.0f}", f"{p['b5_tokens']:.0f}") for p in summary["tau"]["points"]),
                f"Mean recomputed tokens; B7 slope {_p(b7['slope'])} per turn of τ, R² {_p(b7['r2'])}; "
                f"B5 slope {_p(b5['slope'])}."))
        if "indep" in summary:
            ops = list(summary["indep"][0]["any"])
            found.append(Table(f"indep sweep: {suite}", ("indep", *ops),
                               tuple((f"{row['indep']:g}", *(fmt_rate(row["any"][o]) for o in ops))
                                     for row in summary["indep"]), "Any-leak rate per operator."))
        if "checkpoints" in summary:
            found.append(Table(
                f"Checkpoint granularity: {suite}",
                ("checkpoints at", "B7 any", "B7 CAD", "B7 turns", "B7 tokens", "B5 tokens", "B7 = B5",
                 "checkpoints", "cache KiB", "metadata bytes"),
                tuple((str(r["granularity"]), _num(r["b7_any"], ".3f"), _num(r["b7_cad"], ".3f"),
                       _num(r["b7_transitions"], ".1f"), _num(r["b7_tokens"], ".0f"), _num(r["b5_tokens"], ".0f"),
                       _count(r["b7_equals_b5"], "equal"), _num(r["checkpoints"], ".1f"),
                       _num(None if r["retained_bytes"] is None else r["retained_bytes"] / 1024, ".0f"),
                       _num(r["metadata_bytes"], ".0f"))
                      for r in summary["checkpoints"]),
                "Selective replay with a checkpoint at every turn boundary against the session's start only (means "
                "per session): its leaks, turns replayed and recomputed tokens beside the full reset's tokens; the "
                "checkpoints taken, the cache they keep alive beyond the live states, and the bytes of their offsets, "
                "snapshot ids and prompt inventories."))
    return found


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


#: The savings columns of B7: (heading, score field), tokens then transitions, against B5 then B5′.
_SAVINGS = (("tokens vs B5", "savings"), ("tokens vs B5′", "savings_vs_b5_prime"),
            ("turns vs B5", "transition_savings"), ("turns vs B5′", "transition_savings_vs_b5_prime"))


def _exactness(scores: Mapping[str, Mapping[str, Any]]) -> Table:
    rows = []
    for suite, s in scores.items():
        rows.append((
            suite, str(s["sessions"]), "yes" if s["valid"] else "no", _count(s["b7_equals_b5"], "equal"),
            _count(s["b7_transitions_at_bound"], "at_bound"), _count(s.get("b1_equals_b0"), "equal"),
            *(_times(s.get(field)) for _, field in _SAVINGS), _times(s["bound"]),
            ", ".join(s["kept_probes"]) or "-", ", ".join(s.get("not_entered") or []) or "-"))
    return Table("Exactness and savings",
                 ("Suite", "sessions", "valid", "B7 = B5", "B7 at T - tau + 1", "B1 = B0",
                  *(heading for heading, _ in _SAVINGS), "bound", "kept probes", "z never entered"), tuple(rows),
                 "B7 = B5: the final state equal byte for byte. Savings of B7 (selective replay): the reset's "
                 "recomputed tokens (tokens) or agent turns (turns) over B7's, each summed over the sessions both "
                 "ran; below 1.00x B7 costs more than that reset; - where it did not run. B5′ is the full reset "
                 "reusing the cached prompt prefixes that are byte for byte the same. Bound: "
                 "T over T - tau + 1.")


def reach_lines(scores: Mapping[str, Mapping[str, Any]], significance: float = SIGNIFICANCE) -> list[str]:
    """One sentence per sample size at which a suite's tests cannot reach p_adj < `significance`
    (suites of the same sessions and sessions needed share it); none where they can."""
    grouped: dict[tuple[bool, int, int], list[str]] = {}
    for suite, s in scores.items():
        if s.get("min_p_adj") is None or s["min_p_adj"] < significance:
            continue
        grouped.setdefault((s["min_p"] >= significance, s["sessions"], s["sessions_needed"]), []).append(suite)
    lines = []
    for (nothing, sessions, needed), suites in grouped.items():
        who = "no operator can" if nothing else "an operator that alone differs from B5 cannot"
        lines.append(f"{', '.join(suites)}: {who} reach p_adj < {significance:g} with {sessions} sessions; at least "
                     f"{needed} sessions are needed.")
    return lines


def _reach(scores: Mapping[str, Mapping[str, Any]]) -> Table:
    """What the McNemar tests against B5 can reach with each suite's sessions."""
    rows = tuple((suite, str(s["sessions"]), str(sum(o != FULL_RESET for o in s["operators"])), _p(s.get("min_p")),
                  _p(s.get("min_p_adj")), _num(s.get("sessions_needed"), "d"))
                 for suite, s in scores.items())
    note = ("Smallest p: the exact McNemar p against B5 when every session is discordant, all one way. Smallest "
            "p_adj: that p after Benjamini-Hochberg over the suite's tested operators when the operator alone differs "
            "from B5, the others at p = 1. Sessions needed: the fewest sessions whose smallest p_adj is below "
            f"{SIGNIFICANCE:g} with as many tested operators.")
    lines = reach_lines(scores)
    return Table("Reach of the tests", ("Suite", "sessions", "tested operators", "smallest p", "smallest p_adj",
                                        "sessions needed"), rows,
                 " ".join([note, *lines]))


def tables(scores: Mapping[str, Mapping[str, Any]], sweeps: Mapping[str, Mapping[str, Any]] | None = None) -> list[Table]:
    """The lane's tables for `scores` ({suite: `score_suite` output plus `not_entered`}) and the
    sweeps that ran ({suite: `sweep_summary`}): the results page's and the report's."""
    return [_table1(scores), _table2(scores), _reach(scores), *_channel_tables(scores),
            *_sweep_tables(sweeps or {}), *_variants_table(scores), _exactness(scores)]


def render_results(scores: Mapping[str, Mapping[str, Any]], *, model: str, params_digest: str,
                   sweeps: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The page for `scores` ({suite: `score_suite` output plus `not_entered`})."""
    head = ("# Execution-state lane: results\n\n"
            f"Written by the `replay` stage (docs/replay.md) for model `{model}`, replay params digest "
            f'`{params_digest}`. Every operator is read against the full reset B5 (docs/replay.md, "Metrics"). '
            "Do not edit: rerun `dvc repro replay`.\n")
    # the suites where no test can be significant, stated before any p is read
    reach = [f"**{line}**\n" for line in reach_lines({s: v for s, v in scores.items() if not _is_variant(s)})]
    return "\n".join([head, *reach, *(markdown_table(t) for t in tables(scores, sweeps))])
