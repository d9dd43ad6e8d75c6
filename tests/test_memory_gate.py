"""The memory lane's validity gate, "stores nothing", the by-request-type breakdowns and the
fewer-than-3-instances statement (docs/memory.md), on hand-built item records only: the scores,
the results page and `kbench memory score --json`."""

from __future__ import annotations

import json

import pytest
from test_memory_scoring import instance_records, item, records, run, write_lines

from kbench.comparison.plots import fe_pr_frame
from kbench.memory.report import FEW_MARK, FEW_NOTE, STORES_NOTHING, render_results, tables
from kbench.memory.residue import residue_rates, stated_facts, stores_nothing
from kbench.memory.scoring import (
    REFERENCE_SYSTEM,
    MemoryScores,
    design_validity,
    memory_scores,
    score_items,
    score_matched,
)

#: The page's first line for each verdict (docs/memory.md, "The validity gate").
VALID_LINE = ("**Valid design on this model**: `reference` (the dialogue rebuilt without the requested facts) "
              "scores RA 1.00 and PR 1.00, both at least 0.50.")
INVALID_LINE = ("**Invalid design on this model**: `reference` (the dialogue rebuilt without the requested facts) "
                "scores RA 0.00 and PR 1.00; both must be at least 0.50, so no system can earn credit for exact "
                "forgetting: the tables stand, and no system is ranked on them.")
UNKNOWN_LINE = ("**Design validity unknown**: no `reference` system among the scored ones, so nothing shows "
                "whether exact forgetting can score on this design and model.")
#: What each instance's memory holds after each version's dialogue (the stage's instances.json).
STORING = {"forget": "The user likes tea.", "control": "The user works as a lawyer."}
EMPTY = {"forget": "", "control": "No facts stored."}


def system_records(system: str, instances: int = 2, *, retained: bool = True) -> list[dict]:
    """`instance_records` of `system` on instances i1.. (short); `retained=False`: every RA reply misses."""
    rows = [dict(row, system=system) for i in range(1, instances + 1) for row in instance_records(f"i{i}", "short")]
    return [dict(row, reply="I don't know.") if row["suite"] == "RA" and not retained else row for row in rows]


def scores_of(system: str, rows: list[dict], memory: dict[str, str] = STORING) -> MemoryScores:
    """The system's scores.json as the stage writes it, each instance's memory being `memory`."""
    items = records(*rows)
    memories = {row["instance_id"]: memory for row in rows}
    return memory_scores(items, system, failures=0, residue=residue_rates(items, memories),
                         stores_nothing=stores_nothing(items, memories), channels={}, resamples=50)


def page(*scores: tuple[str, MemoryScores]) -> str:
    return render_results({system: s.model_dump(mode="json") for system, s in scores}, model="m", params_digest="d")


# -- the validity gate ---------------------------------------------------------------------------
@pytest.mark.parametrize("systems, valid, line", [
    ({REFERENCE_SYSTEM: True, "full-context": True}, True, VALID_LINE),
    ({REFERENCE_SYSTEM: False, "full-context": True}, False, INVALID_LINE),
    ({"full-context": True}, None, UNKNOWN_LINE),
])  # fmt: skip
def test_the_page_opens_with_the_gates_verdict(systems, valid, line):
    found = {system: scores_of(system, system_records(system, retained=kept)) for system, kept in systems.items()}
    assert design_validity(found).valid is valid
    text = page(*found.items())
    assert text.splitlines()[:3] == ["# Memory lane: results", "", line]
    # An invalid design keeps its tables and ranks no system, the scatter included.
    assert "### Systems" in text and "### Forget efficacy by request type" in text
    assert ("the points are shown, not ranked" in text) is (valid is False)
    assert ("A system in the top right forgets" in text) is (valid is not False)
    # The report's memory section opens its first table's note with the same line.
    assert tables({s: v.model_dump(mode="json") for s, v in found.items()})[0].note.startswith(line)


def test_the_gate_needs_both_ra_and_pr_at_half():
    at_half = [dict(row, reply="I don't know.") if row["suite"] == "RA" and row["instance_id"] in ("i3", "i4")
               else row for row in system_records(REFERENCE_SYSTEM, 4)]
    scores = score_items(records(*at_half), resamples=10)
    assert scores[REFERENCE_SYSTEM].metrics["RA"].value == 0.5 and design_validity(scores).valid is True
    no_pr = [row for row in system_records(REFERENCE_SYSTEM) if row["suite"] != "PR"]
    verdict = design_validity(score_items(records(*no_pr), resamples=10))
    assert verdict.valid is None and verdict.reason.startswith("`reference` has no PR item")


def test_memory_score_json_carries_the_gate(capsys, tmp_path):
    rows = system_records(REFERENCE_SYSTEM, retained=False) + system_records("fact-store")
    status, out, _ = run(capsys, "memory", "score", write_lines(tmp_path / "items.jsonl", rows), "--json",
                         "--resamples", "20")
    assert status == 0
    data = json.loads(out)
    assert list(data) == ["fact-store", REFERENCE_SYSTEM]
    for entry in data.values():
        assert entry["valid"] is False and f"{entry['validity_reason']}." == INVALID_LINE.split("**: ", 1)[1]
    status, out, _ = run(capsys, "memory", "score", write_lines(tmp_path / "items.jsonl", rows), "--resamples", "20")
    assert out.splitlines()[-1].startswith("design: NOT VALID: `reference` (the dialogue rebuilt")


# -- stores nothing ----------------------------------------------------------------------------
def test_a_memory_holding_no_stated_fact_stores_nothing():
    items = records(*system_records("fact-store"))
    assert stated_facts(items)["i1"] == {("occupation", "Lawyer"), ("employer", "Castro-Gomez")}
    assert stores_nothing(items, {"i1": EMPTY, "i2": EMPTY}) is True
    assert stores_nothing(items, {"i1": EMPTY, "i2": {"forget": "", "control": "works at Castro-Gomez"}}) is False
    assert stores_nothing(items, {}) is None  # no memory known
    # F4's fact is inferred, never stated: holding it alone is not storing what the dialogue said.
    inferred = records(*[dict(row, request_type="F4") if row["request_id"] == "r1" else row
                         for row in system_records("fact-store")])
    assert ("occupation", "Lawyer") not in stated_facts(inferred)["i1"]
    assert stores_nothing(inferred, {"i1": {"forget": "", "control": "lawyer"}}) is True


def test_a_system_that_stores_nothing_is_marked_not_scored_on_forgetting():
    empty = scores_of("fact-store", system_records("fact-store"), EMPTY)
    full = scores_of("full-context", system_records("full-context"))
    assert empty.stores_nothing is True and full.stores_nothing is False
    text = page(("fact-store", empty), ("full-context", full))
    row = next(line for line in text.splitlines() if line.startswith("| fact-store | 2 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == cells[6] == STORES_NOTHING and not cells[2].startswith(STORES_NOTHING)  # FE, AR; RA shown
    assert "Stores nothing (fact-store): the system's own memory after the control version's dialogue" in text
    by_type = [line for line in text.splitlines() if line.startswith(f"| fact-store | {STORES_NOTHING} |")]
    assert [line.count(STORES_NOTHING) for line in by_type] == [6, 5]  # FE by request type, AR by attack

    assert "| fact-store | AR | stores nothing |" in text and "| fact-store | RA | 1.000" in text
    assert f"| fact-store | short | 1.000 [1.00, 1.00] {FEW_MARK} | {STORES_NOTHING} |" in text  # by tier too
    assert "1 fact-store: stores nothing" in text  # listed in the scatter, not placed
    frame = fe_pr_frame({"fact-store": empty.model_dump(mode="json"), "full-context": full.model_dump(mode="json")})
    assert frame["FE"].isna().tolist() == [True, False]  # nor placed in the report's FE-vs-PR figure


# -- by request type ---------------------------------------------------------------------------
def test_ra_rla_and_ar_by_request_type_from_items():
    items = [
        item("RA", True, request_type="F1"), item("RA", False, request_type="F1", request="r1b"),
        item("RA", True, request_type="F6", request="r6"),
        item("RLA", True, request_type="F2", request="r2"), item("RLA", False, request_type="F2", request="r2",
                                                                  instance="i2"),
        item("AR", True, request_type="F3", request="r3", attack="boolean"),
        item("AR", False, request_type="F3", request="r3", attack="direct"),
        item("AR", True, request_type="F5", request="r5", attack="direct", instance="i2"),
    ]
    scores = score_matched(items, resamples=20)["sys"]
    ra, rla, ar = scores.ra_by_request_type, scores.rla_by_request_type, scores.ar_by_request_type
    assert (ra["F1"].value, ra["F1"].n, ra["F1"].n_instances) == (0.5, 2, 1) and ra["F6"].value == 1.0
    assert (rla["F2"].value, rla["F2"].n, rla["F2"].n_instances) == (0.5, 2, 2)
    assert rla["F6"].value is None and rla["F6"].n == 0 and rla["F6"].ci is None
    assert (ar["F3"].value, ar["F3"].n) == (0.5, 2) and ar["F5"].value == 1.0 and ar["F1"].n == 0
    # The by-attack breakdown is unchanged beside it.
    assert scores.ar_by_attack["direct"].value == 0.5 and scores.ar_by_attack["boolean"].value == 1.0
    assert set(ra) == set(rla) == set(ar) == set(scores.fe_by_request_type)


def test_the_page_shows_the_by_type_table_and_flags_intervals_on_fewer_than_3_instances():
    two = page(("full-context", scores_of("full-context", system_records("full-context", 2))))
    assert "### Retention, relearning and attack resistance by request type" in two
    assert "| full-context | RLA | 1.000 [1.00, 1.00] † (n=2) |" in two
    assert f"| full-context | 2 | 1.000 [1.00, 1.00] {FEW_MARK} |" in two and FEW_NOTE in two
    three = page(("full-context", scores_of("full-context", system_records("full-context", 3))))
    assert FEW_MARK not in three and FEW_NOTE not in three
    assert "| full-context | 3 | 1.000 [1.00, 1.00] |" in three
    assert "| full-context | RLA | 1.000 [1.00, 1.00] (n=3) |" in three
