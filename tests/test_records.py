"""docs/definitions.md §3 trace records: streaming reader and the validation errors it must give."""

import json

import pytest
from _traces import trace_dict, write_jsonl

from kbench.records import TraceFormatError, iter_traces, read_traces


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_valid_records_stream_back_and_blank_lines_are_skipped(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [json.dumps(trace_dict(query=0)), "", json.dumps(trace_dict(query=1))])
    records = list(iter_traces(path))
    assert [r.query_id for r in records] == ["pii-00000::occupation", "pii-00001::occupation"]
    assert read_traces([path, path])[2].query_id == "pii-00000::occupation"


@pytest.mark.parametrize("missing", ["query_id", "split", "steps", "answer", "raw_reply", "summary_error"])
def test_a_missing_field_is_named_with_its_line(tmp_path, missing):
    bad = trace_dict(query=1)
    del bad[missing]
    path = write_lines(tmp_path / "t.jsonl", [json.dumps(trace_dict(query=0)), json.dumps(bad)])
    with pytest.raises(TraceFormatError) as error:
        list(iter_traces(path))
    assert f"{path}:2" in str(error.value)
    assert f"'{missing}'" in str(error.value)


@pytest.mark.parametrize(
    ("name", "value"), [("halted_reason", "crashed"), ("split", "holdout"), ("field", "phone")]
)
def test_an_unknown_enumerated_value_is_refused_with_line_and_field(tmp_path, name, value):
    path = write_lines(tmp_path / "t.jsonl", [json.dumps({**trace_dict(), name: value})])
    with pytest.raises(TraceFormatError) as error:
        list(iter_traces(path))
    message = str(error.value)
    assert f"{path}:1" in message and f"'{name}'" in message
    assert "query_id pii-00000" in message


def test_broken_json_and_non_objects_are_refused_with_line(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", ["{not json"])
    with pytest.raises(TraceFormatError, match=r"t.jsonl:1: not valid JSON"):
        list(iter_traces(path))
    path = write_lines(tmp_path / "u.jsonl", ["[1, 2]"])
    with pytest.raises(TraceFormatError, match=r"u.jsonl:1: .*JSON object"):
        list(iter_traces(path))


def test_extra_fields_are_kept(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{**trace_dict(), "model": "tiny"}])
    assert next(iter_traces(path)).model_extra == {"model": "tiny"}
