"""Invariants of the observer under random traces (hypothesis).

Note on "CER_c ≤ OR(all)": CER_c averages over the queries where c is not dropped while
OR(all) averages over all n, so with drops a channel's CER can exceed OR(all) (one query
leaking through its answer, one with the answer dropped: CER_answer = 1, OR(all) = 1/2).
What always holds is CER_c · n_observed_c / n ≤ OR(all), and CER_c ≤ OR(all) for the
channels that are never dropped (CoT, tool, tool_wide, RAG); both are tested.
"""

from datetime import date

from _traces import GROUND_TRUTH, trace
from hypothesis import given, settings
from hypothesis import strategies as st

from kbench.config import ScoringConfig
from kbench.observer.matcher import date_variants, match, raw_variants
from kbench.observer.metrics import score_queries, score_traces
from kbench.records import FIELDS
from kbench.observer.verdicts import VERDICTS, CellQuartet, compare_cells

NEVER_DROPPED = ("Z_CoT", "Z_tool", "Z_tool_wide", "Z_RAG")
FAST = ScoringConfig(bootstrap_resamples=100)


def disclosures(field):
    """Texts that leak fully, partly or not at all for the field's ground truth."""
    value = GROUND_TRUTH[field]
    return st.sampled_from([*raw_variants(field, value), value.split()[0], "nothing here", ""])


@st.composite
def records(draw, query, split="forget", method="none"):
    field = draw(st.sampled_from(FIELDS))
    text = disclosures(field)
    halted = draw(st.sampled_from(["final_answer", "final_answer", "parse_error", "max_iters", "tool_fallback"]))
    return trace(
        query=query,
        field=field,
        split=split,
        method=method,
        seed=draw(st.sampled_from([0, 137, 271])),
        thoughts=draw(st.lists(text, max_size=2)),
        tool_args=draw(st.lists(text, max_size=2)),
        observations=draw(st.lists(text, max_size=2)),
        doc_ids=draw(st.lists(text, max_size=2)),
        answer=draw(st.one_of(st.none(), text)),
        raw_reply=draw(text),
        halted_reason=halted,
        summary=draw(st.one_of(st.none(), text)),
        summary_error=draw(st.sampled_from([None, None, "error"])),
    )


@st.composite
def cells(draw, split="forget", method="none", min_size=1):
    size = draw(st.integers(min_size, 12))
    return [draw(records(i, split, method)) for i in range(size)]


@settings(max_examples=80, deadline=None)
@given(cells())
def test_cell_invariants(cell):
    m = score_traces(cell, FAST)
    for channel, cer in m.cer.items():
        if cer is not None:
            assert cer * m.n_observed[channel] / m.n <= m.or_all + 1e-12
    for channel in NEVER_DROPPED:
        assert m.cer[channel] <= m.or_all + 1e-12
    assert m.or_all <= m.or_graded + 1e-12
    budgets = list(m.attacker_budget.values())
    assert all(a <= b for a, b in zip(budgets, budgets[1:]))
    assert m.attacker_budget["A5"] == m.or_all
    if m.shares is not None:
        defined = [s for s in m.shares.values() if s is not None]
        assert abs(sum(defined) - 1.0) < 1e-9 and all(0 <= s <= 1 for s in defined)
    if m.answer_severity is not None:
        assert m.answer_severity >= m.cer["Z_answer"] - 1e-12
    for interval in [m.ci.or_all, *m.ci.cer.values()]:
        if interval is not None:
            assert 0 <= interval[0] <= interval[1] <= 1


@settings(max_examples=80, deadline=None)
@given(cells())
def test_severity_is_at_least_the_binary_hit(cell):
    scored = score_queries(cell)
    assert (scored.severity >= scored.hits).all()
    assert (scored.severity[scored.hits] == 1.0).all()
    assert ((scored.severity >= 0) & (scored.severity <= 1)).all()


@settings(max_examples=25, deadline=None)
@given(
    cells("forget", "none"),
    cells("retain", "none"),
    cells("forget", "m"),
    cells("retain", "m"),
)
def test_k_score_is_in_the_unit_interval_or_null(none_forget, none_retain, method_forget, method_retain):
    quartet = CellQuartet(*(score_queries(c) for c in (none_forget, none_retain, method_forget, method_retain)))
    result = compare_cells(quartet, FAST)
    assert result.verdict in VERDICTS
    if result.verdict in ("TC", "invalid-baseline"):
        assert result.k_score is None
    else:
        assert 0.0 <= result.k_score <= 1.0


@settings(max_examples=200, deadline=None)
@given(st.dates(min_value=date(1900, 1, 1), max_value=date(2030, 12, 31)), st.text(max_size=8), st.text(max_size=8))
def test_every_date_variant_leaks_inside_any_surrounding_text(day, before, after):
    for form in date_variants(day.isoformat()):
        found = match("date_of_birth", day.isoformat(), f"{before} {form} {after}")
        assert found.leaked and found.severity == 1.0
