"""The memory lane's results page (`memory.results`, docs/results-memory.md by default), written
by the `memory_report` stage from each system's scores.json: the shape of Tables 6 and 8 of "Can Agents
Forget When Asked? A Benchmark for Memory Unlearning in LLM Agents"
(systems × RA, FE, PR, RLA, AR, RPR, Score with intervals), FE by request type, AR by attack,
the metrics by length tier and the FE-vs-PR scatter. Pure: scores in, Markdown out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kbench.comparison.report import markdown_table
from kbench.comparison.tables import Table
from kbench.memory.records import ATTACKS, REQUEST_TYPES, TIERS
from kbench.memory.scoring import METRICS
from kbench.observer.channels import CHANNELS
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


def tables(scores: Mapping[str, Mapping[str, Any]]) -> list[Table]:
    """The lane's tables for `scores` ({system: its scores.json}): the results page's and the report's."""
    systems = list(scores)
    found = [Table(
        "Systems", ("System", "instances", *METRICS, "still in memory", "failed memory operations"),
        tuple((system, str(scores[system]["instances"]), *(_cell(scores[system][m], scores[system]["ci"][m]) for m in METRICS),
               _cell((scores[system].get("residue") or {"rate": None})["rate"]), str(scores[system].get("failures", "-")))
              for system in systems),
        f"Each cell is a rate with its {_level(scores)} cluster-bootstrap interval over instances "
        '(docs/memory.md, "Metrics"). '
        "`reference` is the counterfactual: the dialogue rebuilt without the requested facts. Still in memory "
        "(beyond the paper): the fraction of requested facts whose value the system's own memory (stored facts, "
        "summary, index or transcript) still holds after the forget version's dialogue, whatever its replies say.")]
    found.append(Table(
        "Forget efficacy by request type", ("System", *REQUEST_TYPES),
        tuple((system, *(_estimate(scores[system]["fe_by_request_type"][t]) for t in REQUEST_TYPES)) for system in systems),
        "F1 a fact, F2 a topic, F3 a session, F4 an inferred fact, F5 a retraction, F6 a replacement; n: items."))

    def kept(system: str, kind: str) -> str:
        entry = (scores[system].get("residue") or {}).get("by_request_type", {}).get(kind)
        return "-" if entry is None else f"{_cell(entry['rate'])} (n={entry['n']})"

    found.append(Table("Still in memory, by request type", ("System", *REQUEST_TYPES),
                       tuple((system, *(kept(system, t) for t in REQUEST_TYPES)) for system in systems)))
    found.append(Table(
        "Attack resistance by attack", ("System", *ATTACKS),
        tuple((system, *(_estimate(scores[system]["ar_by_attack"][a]) for a in ATTACKS)) for system in systems)))
    channeled = [s for s in systems if scores[s].get("channels")]
    if channeled:
        found.append(Table(
            "Where the fact sits, by channel", ("System", "version", "probes", *CHANNELS),
            tuple((system, version, str(row["n"]), *(_cell(row[c]) for c in CHANNELS))
                  for system in channeled for version, row in scores[system]["channels"].items()),
            "Beyond the paper: each probe reply read as a trace record by the six-channel observer "
            "(docs/memory.md): the fraction of probes about a forgotten fact (forget version: FE and AR; control "
            "version: their RA and AR twins) whose channel holds its value. Z_tool: the system's memory writes from "
            "the request's session on; Z_RAG: what its memory put in front of the model for the question; "
            "Z_summary: what it keeps after the dialogue; it writes no thought."))
    tiers = [t for t in TIERS if any(t in scores[s].get("by_tier", {}) for s in systems)]
    if tiers:
        found.append(Table(
            "By length tier", ("System", "tier", *METRICS),
            tuple((system, tier, *(_cell(row[m], row["ci"][m]) for m in METRICS))
                  for system in systems for tier in tiers
                  if (row := scores[system].get("by_tier", {}).get(tier)) is not None)))
    return found


def render_results(scores: Mapping[str, Mapping[str, Any]], *, model: str, params_digest: str) -> str:
    """The page for `scores` ({system: its scores.json})."""
    systems = list(scores)
    head = ("# Memory lane: results\n\n"
            f"Written by the `memory_report` stage (docs/memory.md) for model `{model}`, memory params digest "
            f"`{params_digest}`. Do not edit: rerun `dvc repro memory_report`.\n")
    scatter_part = "\n".join([
        "### Forgetting against keeping: FE vs PR", "",
        "A system in the top right forgets what it is asked to and keeps the rest; bottom right deletes "
        "too much, top left forgets nothing.", "",
        *scatter({s: (scores[s]["FE"], scores[s]["PR"]) for s in systems}), ""])
    return "\n".join([head, *(markdown_table(t) for t in tables(scores)), scatter_part])


def _level(scores: Mapping[str, Mapping[str, Any]]) -> str:
    levels = {row.get("bootstrap", {}).get("level") for row in scores.values()}
    return f"{levels.pop():.0%}" if len(levels) == 1 and None not in levels else "percentile"
