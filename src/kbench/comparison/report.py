"""Writers of the comparison's outputs: index.html, leaderboard.md and the JSON files.

index.html is one self-contained file (inline CSS, PNGs as base64 data URIs, no script), so
it opens from a DVC checkout, an MLflow artifact view or an e-mail alike.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from kbench.comparison.analysis import Comparison
from kbench.comparison.collect import OutOfDesign
from kbench.comparison.tables import (
    MARKDOWN_COLUMNS,
    Table,
    attacker_budget_table,
    budget_verdict_table,
    control_table,
    form_tables,
    leak_pattern_table,
    leaderboards,
    missing_baseline_table,
    model_tv_table,
    model_verdict_table,
    not_in_design_table,
    probe_baseline_table,
    probe_method_table,
    reach_line,
    sensitivity_table,
    separation_table,
    shown_verdict,
    verdict_matrix,
)
from kbench.names import PARAMETRIC
from kbench.observer.diff import Piece, TrajectoryView
from kbench.observer.format import MISSING
from kbench.observer.verdicts import K_CLASSES
from kbench.versioned import VersionedRecord


def rules_line(comparison: Comparison) -> str:
    """Which matcher rule scored the report and which answer rule parsed its traces."""
    rules = comparison.answer_rules
    parsed = ", ".join(MISSING if rule is None else rule for rule in rules) or MISSING
    if len(rules) > 1:
        parsed += " (mixed: the cells were not parsed alike)"
    if None in rules:
        parsed += f" ({MISSING}: traces that do not record it)"
    return (
        f"Scoring rule {comparison.config.rule} (scoring.rule; the η² table also scores every other "
        f"registered rule). Answer rule of the ReAct parser in these cells: {parsed} "
        "(agent.answer_rule, docs/agent.md)."
    )


@dataclass(frozen=True)
class Provenance:
    """Where the report's numbers come from, printed at its top."""

    experiment: str
    tracking_uri: str
    cell_runs: int
    git_commit: str
    #: The design the report compares (`Design.describe`), and its cells' corpus and model
    #: fingerprints (None: no run of the design yet).
    design: str = ""
    corpus: str | None = None
    model: str | None = None
    #: Cell keys of the store with runs of other designs, left out of every number.
    not_in_design: tuple[OutOfDesign, ...] = field(default_factory=tuple)


_HTML = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(
    """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>K-Bench comparison · {{ provenance.experiment }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; font-size: 14px; }
h1 { font-size: 1.6em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ccc; } h3 { font-size: 1.05em; }
table { border-collapse: collapse; margin: 0.4em 0 0.3em; font-size: 12px; }
th, td { border: 1px solid #ccc; padding: 2px 5px; text-align: left; vertical-align: top; white-space: nowrap; }
th { background: #eef2f7; } tr:nth-child(even) td { background: #fafafa; }
td.runs { font-family: monospace; font-size: 10px; white-space: normal; min-width: 16em; max-width: 24em; }
p.note { color: #555; font-size: 12px; max-width: 70em; margin-top: 0.2em; }
.warning { background: #fff4e0; border-left: 4px solid #e69500; padding: 0.4em 0.8em; }
.ok { background: #eef8ee; border-left: 4px solid #3a3; padding: 0.4em 0.8em; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
.wide { overflow-x: auto; }
details.trajectory { margin: 0.3em 0; } details.trajectory summary { cursor: pointer; }
table.diff td { white-space: pre-wrap; max-width: 40em; font-size: 12px; }
table.diff td.label { white-space: nowrap; color: #555; }
mark.leak { background: #ffd0d0; color: #900; font-weight: bold; }
.moved { color: #a05a00; font-weight: bold; }
</style></head><body>
{% macro render(table) %}
<h3>{{ table.title }}</h3>
{% if table.rows %}
<div class="wide"><table><thead><tr>{% for c in table.columns %}<th>{{ c }}</th>{% endfor %}</tr></thead><tbody>
{% for row in table.rows %}<tr>{% for c, v in zip(table.columns, row) %}<td{% if 'runs' in c.lower() %} class="runs"{% endif %}>{{ v }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table></div>
{% else %}<p>No rows.</p>{% endif %}
{% if table.note %}<p class="note">{{ table.note }}</p>{% endif %}
{% endmacro %}
<h1>K-Bench comparison</h1>
<p class="{{ 'ok' if reach_complete else 'warning' }}"><b>{{ reach }}</b></p>
<p>Experiment <b>{{ provenance.experiment }}</b> at <code>{{ provenance.tracking_uri }}</code>:
{{ provenance.cell_runs }} finished cell runs (the latest run of each cell key), code commit
<code>{{ provenance.git_commit }}</code>. Every run id below is an MLflow run of kind <code>cell</code>;
its trace records are the artifact <code>output/traces.jsonl</code>.</p>
{% if provenance.design %}<p>Design: {{ provenance.design }}; corpus fingerprint
<code>{{ provenance.corpus or "—" }}</code>, model fingerprint <code>{{ provenance.model or "—" }}</code>.
Only cell runs of this design are compared; Benjamini–Hochberg families are its tests alone.</p>{% endif %}

<h2 id="not-in-design">Not in this design</h2>
{% if not_in_design.rows %}<div class="warning"><p>{{ not_in_design.rows | length }} cell key(s) of this
experiment have runs of another design; they are left out.</p>{{ render(not_in_design) }}</div>
{% else %}<p class="ok">Every cell run of the experiment belongs to this design.</p>{% endif %}
<p>{{ rules }}</p>

<h2 id="missing">Missing baselines</h2>
{% if missing.rows %}<div class="warning"><p>{{ missing.rows | length }} row(s) have no finished
baseline run and therefore no verdict.</p>{{ render(missing) }}</div>
{% else %}<p class="ok">Every row has its baseline.</p>{% endif %}

<h2 id="leaderboards">Leaderboards</h2>
<p class="note">One per base model and substrate, best K-Score first. TC (terminal agent collapse) has no
K-Score; invalid-baseline rows have no verdict. K = (1 − graded OR forget) · (1 − |graded Δsel|) · (1 − Δdegen).</p>
{% for table in leaderboards %}{{ render(table) }}{% endfor %}
<img alt="K-Score leaderboards" src="{{ images.k_score }}">

<h2 id="trajectories">Trajectories, baseline beside method</h2>
<p class="note">For each method row, one forget query (the first, by seed and id, whose leaking channels
differ from the baseline's; else the first): every piece of the two trajectories side by side, the ground
truth <mark class="leak">marked</mark> where the matcher finds it. A leak that stopped in one channel and
appeared in another is marked as moved; a K-SUP verdict says so for the whole row. The same view for any
query: <code>kbench diff A.jsonl B.jsonl --query ID</code>.</p>
{% for group in trajectories %}<h3>{{ group.title }}</h3>
{% for view in group.views %}<details class="trajectory" id="{{ view.anchor }}"{% if view.moved %} open{% endif %}><summary><b>{{ view.method }}</b>
({{ view.verdict }}) · {{ view.query }}{% if view.moved %} · <span class="moved">leak moved: {{ view.moved }}</span>{% endif %}</summary>
<table class="diff"><thead><tr><th></th><th>{{ view.before_title }}</th><th>{{ view.after_title }}</th></tr></thead><tbody>
{% for row in view.rows %}<tr><td class="label">{{ row.label }}</td>{% for side in row.sides %}<td>{% if side is none %}{% elif side.dropped %}<i>(dropped)</i>{% else %}{% for text, hit in side.segments %}{% if hit %}<mark class="leak">{{ text }}</mark>{% else %}{{ text }}{% endif %}{% endfor %}{% endif %}</td>{% endfor %}</tr>
{% endfor %}</tbody></table></details>
{% endfor %}{% endfor %}

<h2 id="matrix">Verdict matrix</h2>
{{ render(matrix) }}

<h2 id="budgets">Attacker budgets</h2>
{{ render(budgets) }}
<img alt="attacker-budget curves" src="{{ images.attacker_budget }}">
{{ render(budget_verdicts) }}

<h2 id="leak-patterns">Substrate leak patterns</h2>
<img alt="per-channel CER by substrate" src="{{ images.cer_by_substrate }}">
{% for pair in leak_patterns %}{{ render(pair[0]) }}{{ render(pair[1]) }}{% endfor %}{% if forms %}
<h2 id="forms">Query forms</h2>
<p class="note">The same facts asked other ways (<code>queries.forms</code>): a method clean on the canonical
question may leak on a paraphrase or a completion. The η² table below has the form as a factor.</p>
{% for table in forms %}{{ render(table) }}{% endfor %}{% endif %}{% if models %}
<h2 id="models">Across base models</h2>
{% for table in models %}{{ render(table) }}{% endfor %}{% endif %}

<h2 id="selectivity">Selectivity</h2>
<p class="note">Each (substrate, method) row as a point: forget OR(all) on x, retain OR(all) on y; the
<code>none</code> and <code>gold</code> points are labelled. A selective method sits left of its substrate's
<code>none</code> point at the same height; a point below it also lost retain knowledge (collateral damage).</p>
<img alt="forget OR against retain OR" src="{{ images.selectivity }}">

<h2 id="probes">Direct-elicitation probes</h2>
{% if probes_run %}<p class="note">TOFU-, MUSE-, WMDP- and LUME-style probes of each deployed model read
alone, beside what the observer finds on the deployed agent (docs/probes.md).</p>
{{ render(probe_baselines) }}{{ render(probe_methods) }}
{% else %}<p class="warning">No probe results: run the <code>probes</code> stage (<code>kbench probes</code>).</p>{% endif %}

<h2 id="controls">LoRA-D control</h2>
{{ render(controls) }}

<h2 id="sensitivity">Sensitivity (η²)</h2>
{{ render(sensitivity) }}

<h2 id="replay">Execution-state lane</h2>
{% if lanes.replay %}<p class="note">Forget requests inside a running agent session
(docs/replay.md): each forget operator on the suites' sessions, read against the full reset B5; from the
<code>replay</code> stage's scores.</p>
{% for table in lanes.replay %}{{ render(table) }}{% endfor %}
{% if 'replay_tau_sweep' in images %}<img alt="recomputed tokens against tau" src="{{ images.replay_tau_sweep }}">{% endif %}
{% else %}<p class="warning">No scores of the execution-state lane: run the <code>replay</code> stage
(<code>dvc repro replay</code>).</p>{% endif %}

<h2 id="memory">Memory lane</h2>
{% if lanes.memory %}<p class="note">Forget requests to agent memory systems (docs/memory.md); from
each system's scores.</p>
{% for table in lanes.memory %}{{ render(table) }}{% endfor %}
{% if 'memory_fe_pr' in images %}<img alt="forget efficacy against preservation per memory system" src="{{ images.memory_fe_pr }}">{% endif %}
{% else %}<p class="warning">No scores of the memory lane: run its stages (<code>dvc repro memory_report</code>).</p>{% endif %}
</body></html>
"""
)


def _side(piece: Piece | None) -> dict[str, Any] | None:
    return None if piece is None else {"dropped": piece.text is None, "segments": piece.segments()}


def _view_title(view: TrajectoryView) -> str:
    leaking = ", ".join(view.leaked) or "no channel"
    return f"{view.method}: {view.halted_reason}, {view.failure_mode or 'healthy'}; leaks through {leaking}"


def trajectory_groups(comparison: Comparison) -> list[dict[str, Any]]:
    """The report's trajectory views, grouped by base model and substrate (the leaderboards' order)."""
    verdicts = {r.key: shown_verdict(r) for r in comparison.rows}
    groups: dict[str, list[dict[str, Any]]] = {}
    for item in comparison.trajectories:
        diff, key = item.diff, item.key
        groups.setdefault(f"{key.base_model} · {key.substrate_label}", []).append({
            "anchor": f"trajectory-{key.base_model}-{key.substrate}-{key.recipe}-{key.method}",
            "method": key.method_label,
            "verdict": verdicts[key],
            "query": f"{diff.before.query_id}, seed {diff.before.seed}; ground truth {diff.before.ground_truth}",
            "moved": f"{', '.join(diff.lost)} → {', '.join(diff.gained)}" if diff.migrated else "",
            "before_title": _view_title(diff.before),
            "after_title": _view_title(diff.after),
            "rows": [{"label": f"{label} ({(a or b).channel})", "sides": [_side(a), _side(b)]}
                     for label, a, b in diff.rows()],
        })
    return [{"title": title, "views": views} for title, views in sorted(groups.items())]


def _data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def render_html(comparison: Comparison, images: Mapping[str, Path], provenance: Provenance,
                probes: Mapping[str, Any] | None = None, lanes: Mapping[str, Sequence[Table]] | None = None) -> str:
    """The report; `probes` is the probes stage's summary (None: not run); `lanes` the tables of
    the execution-state and memory lanes (`replay`, `memory`; absent or empty: not run)."""
    return _HTML.render(
        lanes={"replay": [], "memory": [], **(lanes or {})},
        probes_run=bool(probes),
        probe_baselines=probe_baseline_table(comparison, dict(probes or {})),
        probe_methods=probe_method_table(comparison, dict(probes or {})),
        reach=reach_line(comparison),
        reach_complete=bool(comparison.tested) and comparison.reachable_classes == K_CLASSES,
        provenance=provenance,
        not_in_design=not_in_design_table(provenance.not_in_design),
        rules=rules_line(comparison),
        missing=missing_baseline_table(comparison),
        leaderboards=leaderboards(comparison),
        matrix=verdict_matrix(comparison),
        budgets=attacker_budget_table(comparison),
        budget_verdicts=budget_verdict_table(comparison),
        leak_patterns=[
            (leak_pattern_table(p), separation_table(p, comparison.config.tau_factor))
            for p in comparison.leak_patterns
        ],
        controls=control_table(comparison),
        sensitivity=sensitivity_table(comparison),
        models=[model_verdict_table(comparison), model_tv_table(comparison)] if comparison.models else [],
        trajectories=trajectory_groups(comparison),
        forms=form_tables(comparison),
        images={name: _data_uri(path) for name, path in images.items()},
        zip=zip,
    )


def markdown_table(table: Table) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [f"### {table.title}", ""]
    if table.rows:
        lines += [
            "| " + " | ".join(map(cell, table.columns)) + " |",
            "|" + "---|" * len(table.columns),
            *("| " + " | ".join(map(cell, row)) + " |" for row in table.rows),
        ]
    else:
        lines.append("No rows.")
    if table.note:
        lines += ["", table.note]
    return "\n".join(lines) + "\n"


def render_markdown(comparison: Comparison, provenance: Provenance, probes: Mapping[str, Any] | None = None) -> str:
    parts = [
        "# K-Bench leaderboards\n",
        f"**{reach_line(comparison)}**\n",
        f"Experiment `{provenance.experiment}`, {provenance.cell_runs} cell runs; the full report with "
        "every run id is `reports/index.html`.\n",
        rules_line(comparison) + "\n",
    ]
    if provenance.design:
        parts.append(f"Design: {provenance.design}.\n")
    parts += [markdown_table(t.select(MARKDOWN_COLUMNS)) for t in leaderboards(comparison)]
    parts.append(markdown_table(verdict_matrix(comparison)))
    if probes:
        parts += [markdown_table(probe_baseline_table(comparison, dict(probes))),
                  markdown_table(probe_method_table(comparison, dict(probes)))]
    if comparison.missing:
        parts.append(markdown_table(missing_baseline_table(comparison)))
    if provenance.not_in_design:
        parts.append(markdown_table(not_in_design_table(provenance.not_in_design)))
    return "\n".join(parts)


#: The leaderboard columns of the results page: the verdict and its evidence, no run ids.
RESULTS_COLUMNS = (
    "Method", "Recipe", "Verdict", "K-Score", "OR forget [95% CI]", "OR retain [95% CI]", "Δsel",
    "Degen forget", "Failure modes forget", "p_adj", "Dominant",
)
#: The leak-pattern columns of the results page (the report's table less its run ids).
_PATTERN_COLUMNS_DROPPED = ("Runs",)


_RESULTS_LEGEND = (
    "Rows are sorted by K-Score within a substrate; a method is never averaged across substrates. "
    "OR: observer rate over all six channels (forget and retain split, seeds pooled, percentile bootstrap "
    "CI); Δsel: retain OR minus the baseline's; p_adj: paired McNemar against the baseline on forget, "
    "Benjamini–Hochberg over every method row; Dominant: the channel that carries the forget leak, if one "
    "does. Each term and verdict: [definitions.md](definitions.md).\n"
)


def _bare(table: Table) -> str:
    """A table without its note (the results page explains its columns once)."""
    return markdown_table(dataclasses.replace(table, note=""))


@dataclass(frozen=True)
class ResultsHeader:
    """What the results page states once at its top: the design it reports."""

    #: `kbench.design.design_digest` of the params: equal digests, equal cell conditions.
    digest: str
    #: Forget and retain queries per seed and cell (`queries.n_per_split`).
    n_per_split: int
    seeds: tuple[int, ...]
    #: The base model's name and the corpus fingerprint of the cells (None: no cell ran).
    model: str
    corpus: str | None


def render_results(comparison: Comparison, header: ResultsHeader, probes: Mapping[str, Any] | None = None) -> str:
    """docs/results.md: the headline leaderboard per substrate, every method on P, the probes
    beside the agent and the leak pattern, for one design. Nothing run-specific (no run ids,
    no commit, no clock), so one design's cells give the same bytes on every rerun."""
    parts = [
        "# K-Bench results\n",
        "Written by `kbench compare` (the last stage of `dvc repro`) for one design; do not edit by hand. "
        "Definitions of every column: [definitions.md](definitions.md); run ids and every other column: "
        "`reports/index.html`.\n",
        f"**Design** `{header.digest}` (params digest) · model {header.model} · corpus "
        f"{header.corpus or MISSING} · {header.n_per_split} forget and {header.n_per_split} retain queries "
        f"per seed and cell · seeds {', '.join(map(str, header.seeds))}.\n",
        f"{reach_line(comparison)}\n",
        rules_line(comparison) + "\n",
        "## Leaderboards\n",
    ]
    portable = [c for c in RESULTS_COLUMNS if c != "Recipe"]  # off P the recipe is always none
    parts += [_bare(t.select(portable)) for t in leaderboards(comparison, lambda s: s != PARAMETRIC)]
    parts.append("## P: every method on the weights\n")
    parts += [_bare(t.select(RESULTS_COLUMNS)) for t in leaderboards(comparison, lambda s: s == PARAMETRIC)]
    parts += [_RESULTS_LEGEND, _bare(verdict_matrix(comparison))]
    if probes:
        parts += ["## Probes beside the agent\n",
                  markdown_table(probe_baseline_table(comparison, dict(probes))),
                  markdown_table(probe_method_table(comparison, dict(probes)))]
    parts.append("## Leak pattern\n")
    for patterns in comparison.leak_patterns:
        table = leak_pattern_table(patterns)
        parts += [markdown_table(table.select([c for c in table.columns if c not in _PATTERN_COLUMNS_DROPPED])),
                  markdown_table(separation_table(patterns, comparison.config.tau_factor))]
    if comparison.forms:
        parts += ["## Query forms\n", *(markdown_table(t) for t in form_tables(comparison)),
                  markdown_table(sensitivity_table(comparison))]
    if comparison.models:
        parts += ["## Across base models\n", markdown_table(model_verdict_table(comparison)),
                  markdown_table(model_tv_table(comparison))]
        if not comparison.forms:
            parts.append(markdown_table(sensitivity_table(comparison)))
    return "\n".join(parts)


def metrics_json(comparison: Comparison) -> dict[str, Any]:
    """Numbers for `dvc metrics show/diff`: per row, per base model, and the counts."""
    rows: dict[str, Any] = {}
    for r in comparison.rows:
        k = r.key
        rows.setdefault(k.base_model, {}).setdefault(k.substrate, {}).setdefault(k.recipe, {})[k.method] = {
            "k_score": r.verdict.k_score,
            "or_forget": r.forget.or_all,
            "or_retain": r.retain.or_all,
            "delta_sel": r.verdict.delta_sel,
            "degeneration_forget": r.forget.degeneration,
            "p_adj": r.verdict.p_adj,
        }
    return {
        "rows": rows,
        "tau": {p.base_model: p.tau for p in comparison.leak_patterns},
        "rows_compared": len(comparison.rows),
        "verdict_flips_a1_a5": sum(r.flips for r in comparison.rows),
        "missing_baselines": len(comparison.missing),
    }


class _Part(BaseModel):
    """The base of comparison.json's parts: frozen, no key beyond the fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class CellKey(_Part):
    """A row's cell key (`RowKey`)."""

    #: The base model the cells ran on.
    base_model: str
    #: The substrate (P, C, R-text, R-struct).
    substrate: str
    #: The recipe (`none` off P).
    recipe: str
    #: The method.
    method: str


class DesignInfo(_Part):
    """The design the report compares."""

    #: `Design.describe` of the params.
    description: str
    #: The cells' corpus fingerprint; null when no run of the design exists.
    corpus: str | None
    #: The cells' model fingerprint; null when no run of the design exists.
    model: str | None


class OutOfDesignRun(_Part):
    """A cell key with runs of another design, left out of every number (`OutOfDesign`)."""

    #: The cell key.
    key: str
    #: Its latest run of the other design.
    run_id: str
    #: Why it is not of this design.
    reason: str


class ComparisonRow(_Part):
    """One method row: its verdict and everything behind it, with its run ids."""

    #: The row's cell key.
    key: CellKey
    #: The verdict the tables show.
    shown_verdict: str
    #: The row's cell runs, in seed order.
    run_ids: list[str]
    #: Its baseline's cell runs.
    baseline_run_ids: list[str]
    #: Its seeds.
    seeds: list[int]
    #: The verdict with its terms (`Verdict.to_json`).
    verdict: dict[str, Any]
    #: McNemar p on retain against the baseline.
    p_retain: Any
    #: That p adjusted.
    p_adj_retain: Any
    #: Paired forget queries tested.
    pairs: Any
    #: The smallest adjusted p of the row's tests.
    smallest_p_adj: Any
    #: The verdict classes the row's data can reach.
    reachable_classes: list[str]
    #: Splits on which the method changed nothing.
    noop_splits: list[str]
    #: Forget-split metrics (`CellMetrics.to_json`).
    forget: dict[str, Any]
    #: Retain-split metrics.
    retain: dict[str, Any]
    #: Forget metrics per attacker budget.
    by_budget: dict[str, Any]
    #: Verdict flips between the A1 and A5 attacker.
    flips_a1_a5: Any


class ControlRow(_Part):
    """A LoRA-D control row."""

    #: The control's cell key.
    key: CellKey
    #: Its cell runs.
    run_ids: list[str]
    #: Its baseline's cell runs.
    baseline_run_ids: list[str]
    #: Forget-split metrics.
    forget: dict[str, Any]
    #: Retain-split metrics.
    retain: dict[str, Any]
    #: The baseline's forget metrics; null without a baseline.
    baseline_forget: dict[str, Any] | None
    #: Degeneration against the baseline.
    delta_degeneration: Any


class MissingBaselineRow(_Part):
    """A row without a finished baseline run (`MissingBaseline`)."""

    #: The row's cell key.
    key: CellKey
    #: The baseline's cell key it expects.
    expected: CellKey
    #: The row's cell runs.
    run_ids: list[str]


class LeakPatternRow(_Part):
    """One base model's substrate leak pattern (`LeakPatterns`)."""

    #: The base model.
    base_model: str
    #: The separation threshold; null when undefined.
    tau: Any
    #: Whether the substrates' patterns separate.
    hypothesis_holds: Any
    #: Valid substrates whose baseline never leaked.
    no_leak: list[str]
    #: Invalid baselines, left out.
    excluded_invalid: list[str]
    #: Each pair of substrates with its separation.
    pairs: list[dict[str, Any]]
    #: Per substrate: its baseline's shares, CER, validity and run ids.
    baselines: dict[str, dict[str, Any]]
    #: Per variant recipe: the same and its TV to the default recipe.
    recipes: dict[str, dict[str, Any]]


class SensitivityPart(_Part):
    """The η² sensitivity table (`Sensitivity`)."""

    #: Observations in the model.
    observations: int
    #: The matcher rules scored besides the report's.
    scoring_rules: list[str]
    #: η² per design factor.
    eta_squared: dict[str, Any]
    #: Levels per design factor.
    levels: dict[str, Any]


class ModelsPart(_Part):
    """The design across base models (two or more)."""

    #: The base models, in name order.
    models: list[str]
    #: Rows whose verdicts disagree.
    disagreements: int
    #: Each (method, substrate)'s verdict per base model.
    verdicts: list[dict[str, Any]]
    #: The TV between base models' baseline leak patterns.
    baseline_tv: list[dict[str, Any]]


#: Keys comparison.json leaves out when unset: the design parts without provenance, `models` with one model.
_ABSENT_WHEN_NONE = ("design", "not_in_design", "models")


class ComparisonRecord(VersionedRecord):
    """reports/comparison.json: everything behind the tables, machine-readable, with the run ids
    of every number (`comparison_record`)."""

    #: The design compared; null (absent from the file) without provenance.
    design: DesignInfo | None = None
    #: Cell keys with runs of other designs; null (absent) without provenance.
    not_in_design: list[OutOfDesignRun] | None = None
    #: Every method row.
    rows: list[ComparisonRow]
    #: The LoRA-D control rows.
    controls: list[ControlRow]
    #: Rows without a finished baseline.
    missing_baselines: list[MissingBaselineRow]
    #: The verdict classes the design's data can reach.
    reachable_classes: list[str]
    #: Each base model's substrate leak pattern.
    leak_patterns: list[LeakPatternRow]
    #: The probes stage's summary; empty when it has not run.
    probes: dict[str, Any]
    #: The matcher rule that scored the report.
    scoring_rule: str
    #: The ReAct parser's answer rules in the cells (null: traces that do not record it).
    answer_rules: list[str | None]
    #: The η² table.
    sensitivity: SensitivityPart
    #: The design across base models; null (absent) with one base model.
    models: ModelsPart | None = None

    @model_serializer(mode="wrap")
    def _leave_out_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The file of a report without provenance or with one base model has no such key."""
        data = handler(self)
        return {key: value for key, value in data.items() if not (key in _ABSENT_WHEN_NONE and value is None)}


def comparison_record(comparison: Comparison, provenance: Provenance | None = None,
                      probes: Mapping[str, Any] | None = None) -> ComparisonRecord:
    """reports/comparison.json of `comparison` (with the design of `provenance`, and the probes
    stage's summary when it ran)."""
    design = {} if provenance is None else {
        "design": {"description": provenance.design, "corpus": provenance.corpus, "model": provenance.model},
        "not_in_design": [vars(r) for r in provenance.not_in_design],
    }
    out = {
        **design,
        "rows": [
            {
                "key": vars(r.key),
                "shown_verdict": shown_verdict(r),
                "run_ids": list(r.run_ids),
                "baseline_run_ids": list(r.baseline_run_ids),
                "seeds": list(r.seeds),
                "verdict": r.verdict.to_json(),
                "p_retain": r.test_retain.p,
                "p_adj_retain": r.p_adj_retain,
                "pairs": r.test_forget.pairs,
                "smallest_p_adj": r.smallest_p_adj,
                "reachable_classes": list(r.reachable),
                "noop_splits": list(r.noop_splits),
                "forget": r.forget.to_json(),
                "retain": r.retain.to_json(),
                "by_budget": {b: v.to_json() for b, v in r.by_budget.items()},
                "flips_a1_a5": r.flips,
            }
            for r in comparison.rows
        ],
        "controls": [
            {
                "key": vars(c.key),
                "run_ids": list(c.run_ids),
                "baseline_run_ids": list(c.baseline_run_ids),
                "forget": c.forget.to_json(),
                "retain": c.retain.to_json(),
                "baseline_forget": c.baseline_forget.to_json() if c.baseline_forget else None,
                "delta_degeneration": c.delta_degeneration,
            }
            for c in comparison.controls
        ],
        "missing_baselines": [
            {"key": vars(m.key), "expected": vars(m.expected), "run_ids": list(m.run_ids)}
            for m in comparison.missing
        ],
        "reachable_classes": list(comparison.reachable_classes),
        "leak_patterns": [
            {
                "base_model": p.base_model,
                "tau": p.tau,
                "hypothesis_holds": p.hypothesis_holds,
                "no_leak": list(p.no_leak),
                "excluded_invalid": list(p.excluded),
                "pairs": [vars(pair) for pair in p.pairs],
                "baselines": {
                    s.key.substrate_label: {
                        "shares": s.metrics.shares, "cer": s.metrics.cer, "invalid": s.invalid,
                        "run_ids": list(s.run_ids),
                    }
                    for s in p.substrates
                },
                "recipes": {
                    s.key.substrate_label: {
                        "shares": s.metrics.shares, "cer": s.metrics.cer, "invalid": s.invalid,
                        "tv_to_default": s.tv_to_default, "run_ids": list(s.run_ids),
                    }
                    for s in p.recipes
                },
            }
            for p in comparison.leak_patterns
        ],
        "probes": dict(probes or {}),
        "scoring_rule": comparison.config.rule,
        "answer_rules": list(comparison.answer_rules),
        "sensitivity": {
            "observations": comparison.sensitivity.observations,
            "scoring_rules": list(comparison.sensitivity.scoring_rules),
            "eta_squared": {e.factor: e.eta_squared for e in comparison.sensitivity.effects},
            "levels": {e.factor: e.levels for e in comparison.sensitivity.effects},
        },
    }
    if comparison.models:  # two base models or more (absent otherwise: one model's file is unchanged)
        out["models"] = {
            "models": list(comparison.models.models),
            "disagreements": comparison.models.disagreements,
            "verdicts": [{"method": r.method, "substrate": r.substrate, "verdicts": dict(r.verdicts), "agree": r.agree}
                         for r in comparison.models.verdicts],
            "baseline_tv": [dataclasses.asdict(p) for p in comparison.models.baseline_tv],
        }
    return ComparisonRecord.model_validate(out)
