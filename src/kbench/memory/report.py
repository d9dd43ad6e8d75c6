"""The memory lane's results page (`memory.results`, docs/results-memory.md by default), written
by the `memory_report` stage from each system's scores.json: the validity gate's verdict, the shape of
Tables 6 and 8 of "Can Agents Forget When Asked? A Benchmark for Memory Unlearning in LLM Agents"
(systems × RA, FE, PR, RLA, AR, RPR, Score with intervals), FE and RA, RLA, AR by request type (its
Figure 7), AR by attack, the metrics by length tier and the FE-vs-PR scatter. Pure: scores in, Markdown out."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any


from kbench.comparison.report import markdown_table
from kbench.comparison.tables import Table
from kbench.memory.records import ATTACKS, REQUEST_TYPES, TIERS
from kbench.memory.scoring import FEW_INSTANCES, METRICS, MemoryScores, Validity, design_validity
from kbench.observer.channels import CHANNELS
from kbench.observer.format import fmt_rate

#: The scatter's size in characters (FE across, PR up).
_WIDTH, _HEIGHT = 41, 11
#: The marker of an interval drawn from fewer than FEW_INSTANCES instances, and the line that explains it.
FEW_MARK = "†"
FEW_NOTE = (f"{FEW_MARK} the interval rests on fewer than {FEW_INSTANCES} instances: too few for the cluster "
            "bootstrap to show the spread (two instances with the same rate give a zero-width interval), "
            "so read the value alone.")
#: What a system that stores nothing shows instead of its forgetting figures (FE, AR).
STORES_NOTHING = "stores nothing"
#: The gate's verdict, as the page's first line opens it.
VERDICTS: dict[bool | None, str] = {True: "Valid design on this model", False: "Invalid design on this model",
                                    None: "Design validity unknown"}


def _cell(value: float | None, ci: list[float] | None = None, instances: int | None = None) -> str:
    if value is None:
        return "-"
    few = ci is not None and instances is not None and instances < FEW_INSTANCES  # a spread-less interval
    return fmt_rate(value) + ("" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]") + (f" {FEW_MARK}" if few else "")


def _estimate(entry: Mapping[str, Any]) -> str:
    return _cell(entry["value"], entry["ci"], entry.get("n_instances")) + f" (n={entry['n']})"


def _metric(row: Mapping[str, Any], metric: str) -> str:
    """A headline metric's cell of a scores.json row (or of one of its tiers)."""
    return _cell(row[metric], row["ci"][metric], row.get("n_instances", {}).get(metric))


def validity(scores: Mapping[str, Mapping[str, Any]]) -> Validity:
    """The validity gate (docs/memory.md, "The validity gate") on `scores` ({system: its scores.json})."""
    return design_validity({system: MemoryScores.model_validate(row) for system, row in scores.items()})


def validity_line(verdict: Validity) -> str:
    """The page's first line: the gate's verdict with the reference's figures."""
    return f"**{VERDICTS[verdict.valid]}**: {verdict.reason}."


def _stores_nothing(row: Mapping[str, Any]) -> bool:
    return bool(row.get("stores_nothing"))


def _flag_few(table: Table) -> Table:
    """The table with FEW_NOTE under it when one of its cells is marked."""
    if not any(FEW_MARK in cell for row in table.rows for cell in row):
        return table
    return Table(table.title, table.columns, table.rows, " ".join(filter(None, (table.note, FEW_NOTE))))


def scatter(points: Mapping[str, tuple[float | None, float | None]], empty: Collection[str] = ()) -> list[str]:
    """A text scatter of (FE, PR) per system, marked by a digit; the systems in `empty` store nothing
    and are listed, not placed (their FE measures no forgetting)."""
    grid = [[" "] * _WIDTH for _ in range(_HEIGHT)]
    legend = []
    for n, (system, (fe, pr)) in enumerate(points.items(), 1):
        if system in empty:
            legend.append(f"{n} {system}: {STORES_NOTHING}")
            continue
        if fe is None or pr is None:
            legend.append(f"{n} {system}: not scored")
            continue
        x, y = round(fe * (_WIDTH - 1)), round(pr * (_HEIGHT - 1))
        grid[_HEIGHT - 1 - y][x] = str(n % 10) if grid[_HEIGHT - 1 - y][x] == " " else "*"
        legend.append(f"{n} {system}: FE {fe:.3f}, PR {pr:.3f}")
    rows = [("1.0 |" if i == 0 else "0.0 |" if i == _HEIGHT - 1 else "    |") + "".join(r) for i, r in enumerate(grid)]
    return ["```", "PR", *rows, "    +" + "-" * _WIDTH, "     0.0" + " " * (_WIDTH - 11) + "1.0  FE", "",
            *legend, "(* marks systems on the same point)", "```"]


def tables(scores: Mapping[str, Mapping[str, Any]], *, verdict: bool = True) -> list[Table]:
    """The lane's tables for `scores` ({system: its scores.json}): the results page's and the report's;
    `verdict`: open the first table's note with the validity gate's line (the page has it under its title)."""
    systems = list(scores)
    empty = [s for s in systems if _stores_nothing(scores[s])]

    def headline(system: str, metric: str, row: Mapping[str, Any] | None = None) -> str:
        """The metric's cell over every instance (or over `row`, a tier's metrics)."""
        forgetting = metric in ("FE", "AR") and system in empty  # no stored fact: no forgetting to measure
        return STORES_NOTHING if forgetting else _metric(scores[system] if row is None else row, metric)

    found = [Table(
        "Systems", ("System", "instances", *METRICS, "still in memory", "failed memory operations"),
        tuple((system, str(scores[system]["instances"]), *(headline(system, m) for m in METRICS),
               _cell((scores[system].get("residue") or {"rate": None})["rate"]), str(scores[system].get("failures", "-")))
              for system in systems),
        " ".join(filter(None, (
            validity_line(validity(scores)) if verdict else "",
            f"Each cell is a rate with its {_level(scores)} cluster-bootstrap interval over instances "
            '(docs/memory.md, "Metrics"). '
            "`reference` is the counterfactual: the dialogue rebuilt without the requested facts. Still in memory "
            "(beyond the paper): the fraction of requested facts whose value the system's own memory (stored facts, "
            "summary, index or transcript) still holds after the forget version's dialogue, whatever its replies say.",
            f"{STORES_NOTHING.capitalize()} ({', '.join(empty)}): the system's own memory after the control "
            "version's dialogue holds none of the facts that dialogue states, so its FE and AR, conditioned on "
            'RA, measure no forgetting and are not shown (docs/memory.md, "Stores nothing").' if empty else ""))))]
    found.append(Table(
        "Forget efficacy by request type", ("System", *REQUEST_TYPES),
        tuple((system, *(STORES_NOTHING if system in empty else _estimate(scores[system]["fe_by_request_type"][t])
                         for t in REQUEST_TYPES)) for system in systems),
        "F1 a fact, F2 a topic, F3 a session, F4 an inferred fact, F5 a retraction, F6 a replacement; n: items."))
    found.append(Table(
        "Retention, relearning and attack resistance by request type", ("System", "metric", *REQUEST_TYPES),
        tuple((system, family, *(STORES_NOTHING if family == "AR" and system in empty
                                 else _estimate(scores[system][f"{family.lower()}_by_request_type"][t])
                                 for t in REQUEST_TYPES))
              for system in systems for family in ("RA", "RLA", "AR")),
        "The paper's Figure 7 beside FE above: RA (was the fact stored), RLA (is a new value of its kind kept) "
        "and AR (every attack together) over each request type's items; F6 has no RLA probe; n: items."))

    def kept(system: str, kind: str) -> str:
        entry = (scores[system].get("residue") or {}).get("by_request_type", {}).get(kind)
        return "-" if entry is None else f"{_cell(entry['rate'])} (n={entry['n']})"

    found.append(Table("Still in memory, by request type", ("System", *REQUEST_TYPES),
                       tuple((system, *(kept(system, t) for t in REQUEST_TYPES)) for system in systems)))
    found.append(Table(
        "Attack resistance by attack", ("System", *ATTACKS),
        tuple((system, *(STORES_NOTHING if system in empty else _estimate(scores[system]["ar_by_attack"][a])
                         for a in ATTACKS)) for system in systems)))
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
            tuple((system, tier, *(headline(system, m, row) for m in METRICS))

                  for system in systems for tier in tiers
                  if (row := scores[system].get("by_tier", {}).get(tier)) is not None)))
    return [_flag_few(table) for table in found]


def render_results(scores: Mapping[str, Mapping[str, Any]], *, model: str, params_digest: str) -> str:
    """The page for `scores` ({system: its scores.json})."""
    systems = list(scores)
    verdict = validity(scores)
    head = ("# Memory lane: results\n\n"
            f"{validity_line(verdict)}\n\n"
            f"Written by the `memory_report` stage (docs/memory.md) for model `{model}`, memory params digest "
            f"`{params_digest}`. Do not edit: rerun `dvc repro memory_report`.\n")
    reading = ("A system in the top right forgets what it is asked to and keeps the rest; bottom right deletes "
               "too much, top left forgets nothing." if verdict.valid is not False else
               "The design is not valid on this model (the page's first line): the points are shown, not ranked.")
    scatter_part = "\n".join([
        "### Forgetting against keeping: FE vs PR", "", reading, "",
        *scatter({s: (scores[s]["FE"], scores[s]["PR"]) for s in systems},
                 [s for s in systems if _stores_nothing(scores[s])]), ""])
    return "\n".join([head, *(markdown_table(t) for t in tables(scores, verdict=False)), scatter_part])



def _level(scores: Mapping[str, Mapping[str, Any]]) -> str:
    levels = {row.get("bootstrap", {}).get("level") for row in scores.values()}
    return f"{levels.pop():.0%}" if len(levels) == 1 and None not in levels else "percentile"
