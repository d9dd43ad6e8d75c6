"""The memory lane's results page (`memory.results`, docs/results-memory.md by default), written
by the `memory_report` stage from each system's scores.json: the seed's Tables 6 and 8 shape
(systems × RA, FE, PR, RLA, AR, RPR, Score with intervals), FE by request type, AR by attack,
the metrics by length tier and the FE-vs-PR scatter. Pure: scores in, Markdown out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kbench.memory.records import ATTACKS, REQUEST_TYPES, TIERS
from kbench.memory.scoring import METRICS
from kbench.observer.format import fmt_rate

#: The scatter's size in characters (FE across, PR up).
_WIDTH, _HEIGHT = 41, 11


def _cell(value: float | None, ci: list[float] | None = None) -> str:
    if value is None:
        return "-"
    return fmt_rate(value) + ("" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]")


def _estimate(entry: Mapping[str, Any]) -> str:
    return _cell(entry["value"], entry["ci"]) + f" (n={entry['n']})"


def scatter(points: Mapping[str, tuple[float | None, float | None]]) -> list[str]:
    """A text scatter of (FE, PR) per system, marked by the system's initial letter and a digit."""
    grid = [[" "] * _WIDTH for _ in range(_HEIGHT)]
    legend = []
    for n, (system, (fe, pr)) in enumerate(points.items(), 1):
        if fe is None or pr is None:
            legend.append(f"{n} {system}: not scored")
            continue
        x, y = round(fe * (_WIDTH - 1)), round(pr * (_HEIGHT - 1))
        grid[_HEIGHT - 1 - y][x] = str(n % 10) if grid[_HEIGHT - 1 - y][x] == " " else "*"
        legend.append(f"{n} {system}: FE {fe:.3f}, PR {pr:.3f}")
    rows = [("1.0 |" if i == 0 else "0.0 |" if i == _HEIGHT - 1 else "    |") + "".join(r) for i, r in enumerate(grid)]
    return ["```", "PR", *rows, "    +" + "-" * _WIDTH, "     0.0" + " " * (_WIDTH - 11) + "1.0  FE", "",
            *legend, "(* marks systems on the same point)", "```"]


def render_results(scores: Mapping[str, Mapping[str, Any]], *, model: str, params_digest: str) -> str:
    """The page for `scores` ({system: its scores.json})."""
    systems = list(scores)
    lines = [
        "# Memory lane: results",
        "",
        f"Written by the `memory_report` stage (docs/memory.md) for model `{model}`, memory params digest "
        f"`{params_digest}`. Each cell is a rate with its {_level(scores)} cluster-bootstrap interval over "
        "instances and its count (items; requests for RPR; instances for the Score), SPEC §15. "
        "`reference` is the counterfactual: the dialogue rebuilt without the requested facts. "
        "Do not edit: rerun `dvc repro memory_report`.",
        "",
        "## Systems",
        "",
        "| system | instances | " + " | ".join(METRICS) + " | still in memory | failed memory operations |",
        "|---|---:|" + "---:|" * len(METRICS) + "---:|---:|",
    ]
    for system in systems:
        row = scores[system]
        cells = [_cell(row[m], row["ci"][m]) for m in METRICS]
        residue = row.get("residue") or {"rate": None}
        lines.append(f"| {system} | {row['instances']} | " + " | ".join(cells)
                     + f" | {_cell(residue['rate'])} | {row.get('failures', '-')} |")
    lines += ["", "Still in memory (beyond the seed): the fraction of requested facts whose value the system's "
              "own memory (stored facts, summary, index or transcript) still holds after the forget version's "
              "dialogue, whatever its replies say."]
    lines += ["", "## Forget efficacy by request type", "",
              "F1 a fact, F2 a topic, F3 a session, F4 an inferred fact, F5 a retraction, F6 a replacement.", "",
              "| system | " + " | ".join(REQUEST_TYPES) + " |", "|---|" + "---:|" * len(REQUEST_TYPES)]
    for system in systems:
        by_type = scores[system]["fe_by_request_type"]
        lines.append(f"| {system} | " + " | ".join(_estimate(by_type[t]) for t in REQUEST_TYPES) + " |")
    lines += ["", "Still in memory, by request type:", "", "| system | " + " | ".join(REQUEST_TYPES) + " |",
              "|---|" + "---:|" * len(REQUEST_TYPES)]
    for system in systems:
        by_type = (scores[system].get("residue") or {}).get("by_request_type", {})
        lines.append(f"| {system} | " + " | ".join(
            "-" if t not in by_type else f"{_cell(by_type[t]['rate'])} (n={by_type[t]['n']})" for t in REQUEST_TYPES) + " |")
    lines += ["", "## Attack resistance by attack", "",
              "| system | " + " | ".join(ATTACKS) + " |", "|---|" + "---:|" * len(ATTACKS)]
    for system in systems:
        by_attack = scores[system]["ar_by_attack"]
        lines.append(f"| {system} | " + " | ".join(_estimate(by_attack[a]) for a in ATTACKS) + " |")
    tiers = [t for t in TIERS if any(t in scores[s].get("by_tier", {}) for s in systems)]
    if tiers:
        lines += ["", "## By length tier", "", "| system | tier | " + " | ".join(METRICS) + " |",
                  "|---|---|" + "---:|" * len(METRICS)]
        for system in systems:
            for tier in tiers:
                row = scores[system].get("by_tier", {}).get(tier)
                if row is not None:
                    lines.append(f"| {system} | {tier} | " + " | ".join(_cell(row[m], row["ci"][m]) for m in METRICS) + " |")
    lines += ["", "## Forgetting against keeping: FE vs PR", "",
              "A system in the top right forgets what it is asked to and keeps the rest; bottom right deletes "
              "too much, top left forgets nothing.", "",
              *scatter({s: (scores[s]["FE"], scores[s]["PR"]) for s in systems}), ""]
    return "\n".join(lines)


def _level(scores: Mapping[str, Mapping[str, Any]]) -> str:
    levels = {row.get("bootstrap", {}).get("level") for row in scores.values()}
    return f"{levels.pop():.0%}" if len(levels) == 1 and None not in levels else "percentile"
