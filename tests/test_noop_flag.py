"""The no-op flag: a method whose trace records on a split are the baseline's, byte for byte
(the `method` field aside), is flagged `no-op on <split>` in the leaderboards (HTML and
Markdown) and in comparison.json; `none` and `gold` never are."""

from __future__ import annotations

from dataclasses import replace

from _comparison_cells import cell_run

from kbench.comparison.analysis import CellRun, RowKey, compare, identical_traces
from kbench.comparison.report import Provenance, comparison_record, render_html, render_markdown
from kbench.comparison.tables import leaderboards

FORGET = {"answer": 6, "clean": 6}
RETAIN = {"answer": 6, "clean": 6}
#: The retain split of a method that lost one retain leak: one record differs from the baseline's.
RETAIN_LESS_ONE = {"answer": 5, "clean": 7}
PROVENANCE = Provenance("kbench", "sqlite:///mlflow.db", 0, "abc")


def baseline(substrate: str = "C", recipe: str = "none", seed: int = 0) -> CellRun:
    return cell_run("none", substrate, recipe=recipe, seed=seed, forget=FORGET, retain=RETAIN)


def method(name: str, *, forget: dict[str, int] = FORGET, retain: dict[str, int] = RETAIN, seed: int = 0,
           substrate: str = "C", recipe: str = "none") -> CellRun:
    return cell_run(name, substrate, recipe=recipe, seed=seed, forget=forget, retain=retain)


def edited(cell: CellRun, index: int, **update: object) -> CellRun:
    """The cell with one of its records changed."""
    records = list(cell.records)
    records[index] = records[index].model_copy(update=update)
    return replace(cell, records=tuple(records))


def noop(comparison, method_name: str, substrate: str = "C", recipe: str = "none") -> tuple[str, ...]:
    (found,) = [r for r in comparison.rows if r.key == RowKey("tiny", substrate, recipe, method_name)]
    return found.noop_splits


def test_a_method_identical_on_one_split_is_flagged_there_and_not_on_the_other():
    result = compare([baseline(), method("idle", retain=RETAIN_LESS_ONE), method("copy")])
    assert noop(result, "idle") == ("forget",)
    assert noop(result, "copy") == ("forget", "retain")
    board = {r[0]: r for r in leaderboards(result)[0].rows}
    no_op = leaderboards(result)[0].columns.index("No-op")
    assert board["idle"][no_op] == "no-op on forget"
    assert board["copy"][no_op] == "no-op on forget, retain"
    assert board["none"][no_op] == ""


def test_a_method_differing_in_one_record_is_not_flagged():
    # One forget record differs in a field no matcher reads (the raw reply): not byte-identical.
    raw = edited(method("quiet"), 0, raw_reply="Final Answer: Lawyer.")
    # One forget leak stopped.
    leak = method("stopper", forget={"answer": 5, "clean": 7})
    result = compare([baseline(), raw, leak])
    assert noop(result, "quiet") == ("retain",)
    assert noop(result, "stopper") == ("retain",)


def test_the_query_ids_must_be_the_same():
    fewer = method("dropper", forget={"answer": 6, "clean": 5})
    records = [r for r in baseline().records if r.split == "forget"]
    assert not identical_traces(records[:-1], records)
    assert noop(compare([baseline(), fewer]), "dropper") == ("retain",)


def test_records_compare_by_query_whatever_their_order_and_method_field():
    records = [r for r in baseline().records if r.split == "forget"]
    renamed = [r.model_copy(update={"method": "idle"}) for r in reversed(records)]
    assert identical_traces(renamed, records)
    assert not identical_traces([*renamed[1:], renamed[0].model_copy(update={"summary": "x"})], records)


def test_every_seed_must_match_the_baseline_of_its_seed():
    cells = [baseline(seed=0), baseline(seed=137), method("copy", seed=0), method("copy", seed=137)]
    assert noop(compare(cells), "copy") == ("forget", "retain")
    differing = [*cells[:3], method("copy", seed=137, forget={"answer": 5, "clean": 7})]
    assert noop(compare(differing), "copy") == ("retain",)
    # A seed the baseline did not run cannot be shown to be the baseline's.
    unpaired = [baseline(seed=0), method("copy", seed=0), method("copy", seed=137)]
    assert noop(compare(unpaired), "copy") == ()


def test_gold_and_the_baseline_are_never_flagged():
    cells = [baseline("P", "lora"), method("gold", substrate="P", recipe="lora"), baseline()]
    result = compare(cells)
    assert noop(result, "gold", "P", "lora") == ()
    assert noop(result, "none", "P", "lora") == () and noop(result, "none") == ()


def test_the_leaderboard_html_and_json_show_the_flag(tmp_path):
    result = compare([baseline(), method("idle", retain=RETAIN_LESS_ONE), method("stopper", forget={"clean": 12})])
    markdown = render_markdown(result, PROVENANCE)
    (idle_line,) = [line for line in markdown.splitlines() if line.startswith("| idle | none |")]
    (stopper_line,) = [line for line in markdown.splitlines() if line.startswith("| stopper | none |")]
    verdicts = {r.key.method: r.verdict.verdict for r in result.rows}
    assert idle_line.startswith(f"| idle | none | {verdicts['idle']} | no-op on forget | ")
    assert stopper_line.startswith(f"| stopper | none | {verdicts['stopper']} | no-op on retain | ")
    assert "| Method | Recipe | Verdict | No-op | Budget | K-Score |" in markdown

    png = tmp_path / "blank.png"
    png.write_bytes(b"\x89PNG")
    images = {name: png for name in ("k_score", "attacker_budget", "cer_by_substrate", "selectivity")}
    html = render_html(result, images, PROVENANCE)
    assert "<th>No-op</th>" in html and "<td>no-op on forget</td>" in html

    rows = {r["key"]["method"]: r for r in comparison_record(result).model_dump(mode="json")["rows"]}
    assert rows["idle"]["noop_splits"] == ["forget"]
    assert rows["stopper"]["noop_splits"] == ["retain"]
    assert rows["none"]["noop_splits"] == []
