"""The versioned result files: a replay suite's and a memory system's scores.json and
reports/comparison.json are pydantic models. Each writes the same bytes as before versioning
(tests/golden/*.json, written by the hand-built dicts they replace) plus `schema_version`; a
reader names the file and the field of a bad file, and refuses an unversioned one in one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from _comparison_cells import design
from test_memory_scoring import instance_records, records
from test_replay_scoring import suite_records

from kbench import io
from kbench.comparison.analysis import compare
from kbench.comparison.collect import OutOfDesign
from kbench.comparison.report import ComparisonRecord, Provenance, comparison_record
from kbench.memory.residue import residue_rates, stores_nothing
from kbench.memory.scoring import MemoryScores, memory_scores
from kbench.replay.scoring import SuiteScores, checkpoint_costs, suite_scores
from kbench.versioned import SCHEMA_VERSION, VersionedFileError, VersionedRecord, read_versioned

GOLDEN = Path(__file__).parent / "golden"

REPLAY_NOT_ENTERED = ["kbench-sessions-005"]
REPLAY_SESSIONS_INFO = [{"checkpoints": 3, "checkpoint_bytes": 1024, "checkpoint_metadata_bytes": 40},
                        {"checkpoints": 4, "checkpoint_bytes": None, "checkpoint_metadata_bytes": 44}]
REPLAY_CHANNELS = {"B0": {"turns": 2, "Z_CoT": 0.5, "Z_tool": 0.5, "Z_tool_wide": 0.5, "Z_RAG": None,
                          "Z_answer": 1.0, "Z_summary": None},
                   "B5": {"turns": 2, "Z_CoT": 0.0, "Z_tool": 0.0, "Z_tool_wide": 0.0, "Z_RAG": None,
                          "Z_answer": 0.0, "Z_summary": None}}
MEMORY_MEMORIES = {"i1": {"forget": "The user works as a lawyer.", "control": "lawyer"},
                   "i2": {"forget": "The user likes tea.", "control": ""}}
MEMORY_CHANNELS = {"forget": {"n": 4, "Z_CoT": None, "Z_tool": 0.25, "Z_tool_wide": 0.25, "Z_RAG": 0.5,
                              "Z_answer": 0.0, "Z_summary": 1.0},
                   "control": {"n": 0, "Z_CoT": None, "Z_tool": None, "Z_tool_wide": None, "Z_RAG": None,
                               "Z_answer": None, "Z_summary": None}}


def replay_scores() -> SuiteScores:
    return suite_scores(suite_records(), "kbench-sessions", not_entered=REPLAY_NOT_ENTERED,
                        checkpoints=checkpoint_costs("every_turn", REPLAY_SESSIONS_INFO), channels=REPLAY_CHANNELS)


def no_session_entered() -> SuiteScores:
    return suite_scores([], "kbench-sessions", not_entered=REPLAY_NOT_ENTERED,
                        checkpoints=checkpoint_costs("session_start", []), channels={})


def system_scores() -> MemoryScores:
    items = records(*instance_records("i1", "short"), *instance_records("i2", "long"))
    return memory_scores(items, "sys", failures=3, residue=residue_rates(items, MEMORY_MEMORIES),
                         stores_nothing=stores_nothing(items, MEMORY_MEMORIES), channels=MEMORY_CHANNELS, resamples=50)


def comparison() -> ComparisonRecord:
    """Two base models (the `models` part) and a provenance (the design parts)."""
    other = [dataclasses.replace(c, base_model="other", run_id=c.run_id.replace(c.base_model, "other", 1))
             for c in design()]
    provenance = Provenance("kbench", "sqlite://", 12, "abc", design="a design", corpus="c1", model=None,
                            not_in_design=(OutOfDesign(key="tiny/C/none/ga", run_id="run-9", reason="another corpus"),))
    return comparison_record(compare(design() + other), provenance, {"models": {"tiny": {"tofu": 0.5}}})


CASES = [  # (the model, its golden file, the stage that writes it)
    (replay_scores, "replay_scores.json", "replay"),
    (no_session_entered, "replay_scores_not_entered.json", "replay"),
    (system_scores, "memory_scores.json", "memory"),
    (comparison, "comparison.json", "compare"),
]


def same_json(a: object, b: object) -> bool:
    """Equal JSON values, the same keys in the same order, floats equal to 1e-9 relative (1e-12 absolute)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-9, abs=1e-12)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("build, golden, stage", CASES)
def test_the_file_is_the_unversioned_one_plus_its_schema_version_and_reads_back_equal(tmp_path, build, golden, stage):
    record = build()
    data = record.model_dump(mode="json")
    assert data.pop("schema_version") == SCHEMA_VERSION
    if golden == "comparison.json":  # its η² fits move in the last bits with BLAS threads: same layout, close values
        assert same_json(json.loads(io.json_text(data, allow_nan=False)), json.loads((GOLDEN / golden).read_text()))
    else:
        assert io.json_text(data, allow_nan=False) == (GOLDEN / golden).read_text()
    path = io.write_json(tmp_path / golden, record.model_dump(mode="json"), allow_nan=False)
    again = read_versioned(path, type(record), stage=stage)
    assert again == record
    assert io.json_text(again.model_dump(mode="json"), allow_nan=False) == path.read_text()


def test_a_suite_no_session_entered_is_reported_and_not_scored():
    scores = no_session_entered()
    assert not scores.valid and scores.sessions == 0 and scores.operators == {} and scores.tests is None
    assert scores.not_entered == REPLAY_NOT_ENTERED and scores.checkpoints.checkpoints is None


def test_the_pure_scorers_output_is_unchanged_by_the_stages_fields():
    """`kbench replay score --json` prints the suite's metrics: no stage field, no schema_version."""
    from kbench.replay.scoring import score_sessions

    metrics = score_sessions(suite_records())["kbench-sessions"].model_dump(mode="json")
    stored = json.loads((GOLDEN / "replay_scores.json").read_text())
    assert metrics == {k: v for k, v in stored.items() if k not in ("not_entered", "checkpoints", "channels")}


@pytest.mark.parametrize("build, golden, stage", CASES)
def test_a_bad_field_is_named_with_the_file(tmp_path, build, golden, stage):
    data = build().model_dump(mode="json")
    key = next(k for k in ("sessions", "instances", "scoring_rule") if k in data)
    data[key] = ["not", "a", "number"]
    path = io.write_json(tmp_path / golden, data)
    with pytest.raises(VersionedFileError, match=rf"{path} is not a valid \w+: key '{key}'.*rerun its stage "
                                                 rf"\(`dvc repro {stage}`\)"):
        read_versioned(path, type(build()), stage=stage)
    data.pop(key)
    data["surprise"] = 1
    with pytest.raises(VersionedFileError, match=rf"unknown key 'surprise'"):
        read_versioned(io.write_json(path, data), type(build()), stage=stage)


@pytest.mark.parametrize("build, golden, stage", CASES)
def test_a_file_written_before_versioning_is_refused_in_one_line(tmp_path, build, golden, stage):
    path = tmp_path / "artifacts" / golden
    path.parent.mkdir()
    path.write_text((GOLDEN / golden).read_text())
    with pytest.raises(VersionedFileError) as error:
        read_versioned(path, type(build()), stage=stage)
    assert str(error.value) == (f"{path} was written before result files were versioned (no schema_version): "
                                f"rerun its stage (`dvc repro {stage}`)")


def test_another_version_or_an_unreadable_file_is_refused(tmp_path):
    path = io.write_json(tmp_path / "scores.json", {"schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(VersionedFileError, match=f"has schema_version {SCHEMA_VERSION + 1}, this kbench reads"):
        read_versioned(path, VersionedRecord, stage="replay")
    path.write_text("{")
    with pytest.raises(VersionedFileError, match=r"scores.json is unreadable .*rerun `dvc repro replay`"):
        read_versioned(path, VersionedRecord, stage="replay")
