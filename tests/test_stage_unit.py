"""The one stage skeleton under every lane's unit of work (`kbench.stages.unit`): the resume check
(same inputs keep, foreign or unreadable inputs start over in one log line), the parts written
in plan order, and the three stages built on it."""

from __future__ import annotations

import ast
import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import BaseModel

from kbench import io
from kbench.stages.unit import INPUTS_FILE, PartFiles, Parts, open_unit, read_inputs

SRC = Path(__file__).resolve().parents[1] / "src/kbench/stages"


def assert_corrupt_inputs_start_over(folder: Path, rerun: Callable[[], int], caplog: pytest.LogCaptureFixture) -> None:
    """Corrupt `folder`'s inputs.json and rerun its stage: exit 0, one warning naming the file."""
    path = folder / INPUTS_FILE
    path.write_text('{"digest": ')
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert rerun() == 0
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    named = [m for m in warned if INPUTS_FILE in m]
    assert len(named) == 1 and named[0].endswith(" is unreadable (JSONDecodeError): starting its unit over")
    assert Path(named[0].split(" is unreadable")[0]).resolve() == path.resolve()
    assert json.loads(path.read_text()) is not None


def test_the_same_inputs_keep_the_folder_and_drop_only_its_stale_files(tmp_path):
    unit = tmp_path / "unit"
    assert open_unit(unit, {"digest": "a", "path": Path("x")}, what="it") is False
    (unit / "done.jsonl").write_text("{}\n")
    (unit / "metrics.json").write_text("{}")
    assert open_unit(unit, {"digest": "a", "path": Path("x")}, what="it", stale=("metrics.json",)) is True
    assert (unit / "done.jsonl").exists() and not (unit / "metrics.json").exists()


@pytest.mark.parametrize("content", ["", '{"dig', "[1]", "\udcff"])
def test_a_foreign_or_unreadable_inputs_file_starts_the_unit_over_in_one_line(tmp_path, caplog, content):
    unit = tmp_path / "unit"
    unit.mkdir()
    (unit / INPUTS_FILE).write_text(content, errors="surrogateescape")
    (unit / "done.jsonl").write_text("{}\n")
    with caplog.at_level(logging.WARNING):
        assert open_unit(unit, {"digest": "a"}, what="it") is False
    assert not (unit / "done.jsonl").exists() and read_inputs(unit) == {"digest": "a"}
    assert len([r for r in caplog.records if str(unit / INPUTS_FILE) in r.getMessage()]) == 1
    (unit / "done.jsonl").write_text("{}\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert open_unit(unit, {"digest": "b"}, what="it") is False  # a foreign digest
    assert not (unit / "done.jsonl").exists()
    assert [r.getMessage() for r in caplog.records] == [f"{unit}: made from other inputs; starting it over"]


class Row(BaseModel):
    part: str
    value: int


ROWS: PartFiles[Row, Row] = PartFiles(
    records="rows.jsonl", traces="traces.jsonl", info="parts.json",
    read_records=lambda path: [Row.model_validate(d) for _, d in io.read_json_lines(path, ValueError)],
    write_records=io.write_jsonl, read_traces=lambda path: [Row.model_validate(d) for _, d in io.read_json_lines(path, ValueError)],
    record_part=lambda row: row.part, trace_part=lambda row: row.part)


def test_parts_are_written_in_plan_order_and_resumed_by_what_the_stage_keeps(tmp_path):
    parts = Parts(tmp_path, ROWS, ["a", "b", "c"])
    parts.add("c", {"n": 3}, [Row(part="c", value=3)], [Row(part="c", value=30)])
    parts.add("a", {"n": 1}, [Row(part="a", value=1)], [Row(part="a", value=10)])
    assert list(json.loads((tmp_path / "parts.json").read_text())) == ["a", "c"]
    assert [r.part for r in ROWS.read_records(tmp_path / "rows.jsonl")] == ["a", "c"]
    again = Parts(tmp_path, ROWS, ["a", "b", "c"])
    again.resume(lambda part, info, records, traces: info["n"] != 3)
    assert again.done() == ["a"] and [r.value for r in again.records()] == [1] and [t.value for t in again.traces()] == [10]
    (tmp_path / "parts.json").write_text("{")
    broken = Parts(tmp_path, ROWS, ["a", "b", "c"])
    broken.resume()
    assert broken.done() == []


@pytest.mark.parametrize("stage", ["cell", "replay", "memory"])
def test_each_lane_stage_runs_its_unit_through_the_skeleton(stage):
    """No lane keeps a resume check, an inputs file or a worker model cache of its own."""
    tree = ast.parse((SRC / f"{stage}.py").read_text())
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "open_unit" in called
    source = (SRC / f"{stage}.py").read_text()
    assert "inputs.json" not in source and "functools.cache" not in source and "build_backend(" not in source
