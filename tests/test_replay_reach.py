"""What a suite's tests against B5 can reach with its sessions, and B7's savings against B5 and
B5′ (docs/replay.md, "Metrics"): the score fields, computed from records, and the results page
and report section that show them."""

from __future__ import annotations

import pytest
from test_replay_scoring import T, TAU, _clean_post, _leaky_post, record

from kbench.observer.statistics import benjamini_hochberg
from kbench.replay import score_sessions
from kbench.replay.records import OPERATORS
from kbench.replay.report import reach_lines, render_results
from kbench.replay.scoring import reach

LEAKY = ("B0", "B1")  # contaminated operators: they keep z


def all_operators(sessions: int, suite: str = "kbench-sessions", **tokens: int) -> list:
    """`sessions` sessions under every built-in operator; B0 and B1 leak z, the others act like B5.
    `tokens` (B5, B5prime, B7) sets their recomputed tokens."""
    cost = {"B5": tokens.get("B5", 1000), "B5'": tokens.get("B5prime", 1000), "B7": tokens.get("B7", 250)}
    turns = {"B5": T, "B5'": T, "B7": T - TAU + 1}
    return [record(f"s{i}", op, _leaky_post() if op in LEAKY else _clean_post(), suite=suite,
                   state=f"dirty{i}" if op in LEAKY else f"clean{i}", transitions=turns.get(op, 0),
                   tokens=cost.get(op, 0))
            for i in range(sessions) for op in OPERATORS]


def page(scores) -> str:
    return render_results({s: m.model_dump(mode="json") for s, m in scores.items()}, model="m", params_digest="d")


def test_the_smallest_p_at_4_8_and_9_sessions_with_bh_over_ten_operators():
    four, eight, nine = reach(4, 10), reach(8, 10), reach(9, 10)
    assert four["min_p"] == 0.125  # 2 · ½⁴: no p below it, adjusted or not
    assert four["min_p_adj"] == 1.0  # 10 · 0.125, capped: an operator alone differing from B5
    # the "about 0.31 after BH": four of the ten operators differing on all 4 sessions
    assert benjamini_hochberg([0.125] * 4 + [1.0] * 6)[0] == pytest.approx(0.3125)
    assert eight["min_p"] == pytest.approx(0.0078125) and eight["min_p_adj"] == pytest.approx(0.078125)
    assert nine["min_p_adj"] == pytest.approx(0.0390625) and nine["min_p_adj"] < 0.05
    assert four["sessions_needed"] == eight["sessions_needed"] == nine["sessions_needed"] == 9
    assert reach(4, 1) == {"min_p": 0.125, "min_p_adj": 0.125, "sessions_needed": 6}  # no family to adjust over
    assert reach(4, 0) == {"min_p": None, "min_p_adj": None, "sessions_needed": None}


@pytest.mark.parametrize("sessions, min_p_adj", [(4, 1.0), (8, 0.078125), (9, 0.0390625)])
def test_the_suites_reach_is_scored_from_its_records(sessions, min_p_adj):
    scores = score_sessions(all_operators(sessions))["kbench-sessions"]
    assert scores.sessions == sessions and len(scores.operators) == 11  # 10 tested against B5
    assert scores.min_p == pytest.approx(2 * 0.5**sessions)
    assert scores.min_p_adj == pytest.approx(min_p_adj) and scores.sessions_needed == 9
    # B0 and B1 differ from B5 on every session: their actual p_adj, two of ten at the least p
    assert scores.tests["B0"].mcnemar_any.p_adj == pytest.approx(min(1.0, 2 * 0.5**sessions * 10 / 2))


def test_the_page_says_when_nothing_can_be_significant():
    scores = {**score_sessions(all_operators(4)), **score_sessions(all_operators(4, "agentdojo-banking")),
              **score_sessions(all_operators(8, "eight")), **score_sessions(all_operators(9, "nine"))}
    text = page(scores)
    head = text.split("### Table 1")[0]
    assert ("**kbench-sessions, agentdojo-banking: no operator can reach p_adj < 0.05 with 4 sessions; at least 9 "
            "sessions are needed.**") in head
    assert ("**eight: an operator that alone differs from B5 cannot reach p_adj < 0.05 with 8 sessions; at least 9 "
            "sessions are needed.**") in head
    assert "nine:" not in head  # 9 sessions can reach it
    section = text.split("### Reach of the tests")[1].split("###")[0]
    assert "| kbench-sessions | 4 | 10 | 0.125 | 1 | 9 |" in section
    assert "| eight | 8 | 10 | 0.00781 | 0.0781 | 9 |" in section
    assert "| nine | 9 | 10 | 0.00391 | 0.0391 | 9 |" in section
    assert "kbench-sessions, agentdojo-banking: no operator can reach p_adj < 0.05 with 4 sessions" in section


def test_the_reach_is_in_the_reports_lane_section_too(tmp_path):
    from kbench.comparison.analysis import compare
    from kbench.comparison.report import Provenance
    from kbench.config import Params
    from kbench.stages.compare import LaneScores, write_reports

    scores = {s: m.model_dump(mode="json") for s, m in score_sessions(all_operators(4)).items()}
    write_reports(compare([], Params.model_validate({}).scoring), tmp_path, Provenance("kbench", "sqlite://", 0, "abc"),
                  None, LaneScores(replay=scores))
    html = (tmp_path / "index.html").read_text()
    section = html.split('<h2 id="replay">')[1].split('<h2 id="memory">')[0]
    assert "Reach of the tests" in section and "<td>0.125</td>" in section
    assert "no operator can reach p_adj &lt; 0.05 with 4 sessions; at least 9 sessions are needed." in section
    assert "<th>tokens vs B5′</th>" in section


def test_b7_cheaper_than_b5_and_dearer_than_b5_prime():
    """The issue's agentdojo-banking figures: B7 675 tokens against B5′'s 396."""
    scores = score_sessions(all_operators(4, B5=1500, B5prime=396, B7=675))["kbench-sessions"]
    assert scores.savings == pytest.approx(1500 / 675) and scores.savings > 1  # cheaper than the full reset
    assert scores.savings_vs_b5_prime == pytest.approx(396 / 675) and scores.savings_vs_b5_prime < 1  # dearer
    assert scores.transition_savings == scores.transition_savings_vs_b5_prime == pytest.approx(T / (T - TAU + 1))
    row = next(line for line in page({"kbench-sessions": scores}).split("### Exactness and savings")[1].splitlines()
               if line.startswith("| kbench-sessions"))
    assert "| 2.22x | 0.59x | 1.33x | 1.33x | 1.33x |" in row  # tokens vs B5, vs B5′, turns vs B5, vs B5′, bound
    assert "B5′ is the full reset reusing the cached prompt prefixes" in page({"kbench-sessions": scores})


def test_savings_against_b5_prime_use_the_sessions_both_ran():
    # B5′ ran on s0 and s1 only
    records = [r for r in all_operators(4, B5prime=100) if not (r.operator == "B5'" and r.session_id in ("s2", "s3"))]
    scores = score_sessions(records)["kbench-sessions"]
    assert scores.savings_vs_b5_prime == pytest.approx(200 / 500)  # s0, s1: 2 · 100 over 2 · 250
    assert scores.savings == pytest.approx(4.0)  # every session against B5
    without = score_sessions([r for r in records if r.operator != "B5'"])["kbench-sessions"]
    assert without.savings_vs_b5_prime is None and without.transition_savings_vs_b5_prime is None
    assert "| 4.00x | - | 1.33x | - | 1.33x |" in page({"kbench-sessions": without})


def test_a_suite_without_tested_operators_has_no_reach_line():
    only_reset = [r for r in all_operators(4) if r.operator == "B5"]
    scores = score_sessions(only_reset)["kbench-sessions"]
    assert (scores.min_p, scores.min_p_adj, scores.sessions_needed) == (None, None, None)
    assert reach_lines({"kbench-sessions": scores.model_dump(mode="json")}) == []


def test_kbench_replay_score_prints_savings_against_both_resets(tmp_path, capsys):
    from kbench.cli.main import main
    from kbench.replay.records import write_sessions

    path = write_sessions(tmp_path / "sessions.jsonl", all_operators(4, B5=1500, B5prime=396, B7=675))
    assert main(["replay", "score", str(path)]) == 0
    text = capsys.readouterr().out
    assert "B7 against B5: savings 2.22x" in text and "B7 against B5': savings 0.59x (below 1.00x B7 costs more)" in text
