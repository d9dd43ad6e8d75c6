"""Two trajectories of one query side by side (kbench.observer.diff): the pieces and where the
ground truth sits in them, the alignment, a moved leak, the query a report shows, `kbench diff`
in the terminal and the report's trajectory views in Chromium."""

from __future__ import annotations

import subprocess

import pytest
from _comparison_cells import design
from _traces import leaking, trace, write_jsonl

from kbench.cli.main import main
from kbench.comparison.analysis import compare
from kbench.comparison.report import Provenance
from kbench.observer.diff import diff_traces, find_record, telling_query, trajectory_view
from kbench.stages.compare import write_reports

CHROMIUM = "/usr/bin/chromium"


def test_a_view_locates_the_ground_truth_in_each_piece_as_the_matcher_reads_it():
    record = trace(thoughts=["Her job:  LAWYER, says the bio."], tool_args=["Ann"],
                   observations=["Ann Lee is a Lawyer."], answer="Lawyer", summary="a lawyer and a lawyer")
    view = trajectory_view(record)
    by_part = {p.part: p for p in view.pieces}
    assert [p.part for p in view.pieces] == ["thought", "action", "observation", "answer", "summary"]
    assert by_part["thought"].segments() == [("Her job:  ", False), ("LAWYER", True), (", says the bio.", False)]
    assert by_part["action"].spans == () and by_part["action"].tool == "search_wiki"
    assert by_part["action"].label == "step 1 action search_wiki"
    assert len(by_part["summary"].spans) == 2
    assert view.leaked == ("Z_CoT", "Z_tool_wide", "Z_answer", "Z_summary")
    # a piece is marked exactly where its channel leaks
    for piece in view.pieces:
        assert bool(piece.spans) == (piece.channel in view.leaked or piece.part == "observation")
    dropped = trajectory_view(trace(halted_reason="max_iters", answer=None, thoughts=["t"], summary_error="boom"))
    assert [p.text for p in dropped.pieces if p.part in ("answer", "summary")] == [None, None]


def test_a_diff_aligns_both_sides_and_marks_a_moved_leak():
    before = leaking("Z_answer", query=3)
    after = leaking("Z_summary", query=3, method="m", thoughts=["thinking"])
    diff = diff_traces(before, after)
    assert diff.lost == ("Z_answer",) and diff.gained == ("Z_summary",) and diff.migrated
    labels = [label for label, _, _ in diff.rows()]
    assert labels == ["step 1 thought", "answer", "summary"]
    assert diff.rows()[0][1] is None and diff.rows()[0][2].text == "thinking"  # only the method thought
    assert not diff_traces(before, before).migrated
    with pytest.raises(ValueError, match="one query"):
        diff_traces(before, leaking("Z_answer", query=4))


def test_the_query_a_report_shows_is_the_first_whose_leaks_differ():
    before = [leaking("Z_answer", query=i) for i in range(4)] + [trace(query=9, split="retain")]
    after = [leaking("Z_answer", query=i, method="m") for i in range(2)] + [trace(query=i, method="m") for i in (2, 3)]
    assert telling_query(before, after) == (0, "pii-00002::occupation")
    assert telling_query(before, before) == (0, "pii-00000::occupation")  # none differs: the first
    assert telling_query(before, [trace(query=7)]) is None
    assert find_record(before, "pii-00001::occupation").query_id == "pii-00001::occupation"
    assert find_record(before, "pii-00001::occupation", seed=5) is None


def test_kbench_diff_prints_both_trajectories_with_the_ground_truth_marked(tmp_path, capsys):
    a = write_jsonl(tmp_path / "a.jsonl", [leaking("Z_answer", query=i) for i in range(3)])
    b = write_jsonl(tmp_path / "b.jsonl", [leaking("Z_summary", query=i, method="eco") for i in range(3)])
    assert main(["diff", str(a), str(b), "--query", "pii-00001::occupation"]) == 0
    out = capsys.readouterr().out
    assert "query pii-00001::occupation (seed 0, forget); ground truth: Lawyer" in out
    assert "«Lawyer»" in out and "a «lawyer»" in out
    assert "leak moved: Z_answer -> Z_summary" in out
    assert "\033[" not in out  # not a terminal: no colour codes
    assert main(["diff", str(a), str(b), "--query", "pii-00099::occupation"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a.jsonl has no trace record of query pii-00099::occupation" in err[0]


def test_the_report_shows_each_method_row_beside_its_baseline_in_chromium(tmp_path):
    """Chromium loads the report and its DOM holds a view per method row with a baseline: the
    K-SUP row opened, its moved leak named, the ground truth marked on both sides."""
    comparison = compare(design())
    write_reports(comparison, tmp_path / "reports", Provenance("kbench", "sqlite:///mlflow.db", 31, "abc"))
    page = (tmp_path / "reports" / "index.html").as_uri()
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
         "--disable-background-networking", "--disable-component-update", f"--user-data-dir={tmp_path / 'p'}",
         "--dump-dom", page],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    tested = [r for r in comparison.rows if not r.key.is_baseline]
    assert len(comparison.trajectories) == len(tested) == dom.count('<details class="trajectory"')
    start = dom.index('id="trajectory-tiny-C-none-migrator"')
    migrator = dom[start : dom.index("</details>", start)]
    assert " open" in dom[start - 40 : start + 60] and "(K-SUP)" in migrator
    assert "leak moved: Z_answer → Z_summary" in migrator
    assert '<mark class="leak">Lawyer</mark>' in migrator and '<mark class="leak">lawyer</mark>' in migrator
