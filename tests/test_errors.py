"""One error path (issue 14): each bad input a user can meet is one line naming the file (and
line), exit 2, never a traceback; `--debug` shows the traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _agent_fixtures import index_dir, small_corpus, tiny_model_dir  # noqa: F401  (fixtures)
from _traces import leaking, trace, write_jsonl

from kbench.cli.main import main
from kbench.config import ModelConfig
from kbench.corpus import DISTRACTORS_FILE, FACTS_FILE, QUERIES_FILE, write_corpus
from kbench.stages.unit import INPUTS_FILE, open_unit


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def one_line_error(capsys, *argv, names: str) -> str:
    status, _, err = run(capsys, *argv)
    assert status == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert names in err, err
    return err


def _params(tmp_path: Path, **sections) -> Path:
    import yaml

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(sections))
    return path


# -- models and endpoints -----------------------------------------------------------------------
def test_a_missing_or_unbuilt_model_folder_is_one_line_naming_it(capsys, tmp_path):
    absent = tmp_path / "no-model"
    err = one_line_error(capsys, "--params", str(_params(tmp_path, model={"path": str(absent)})), "params",
                         names=str(absent))
    assert "make setup" in err and "hub" not in err
    empty = tmp_path / "empty-model"
    empty.mkdir()
    one_line_error(capsys, "--params", str(_params(tmp_path, model={"path": str(empty)})), "params",
                   names=f"{empty} is not a model folder")


def test_the_model_loader_refuses_a_bad_path_without_touching_a_hub(tmp_path):
    from kbench.backends import BackendError
    from kbench.backends.hf import load_model

    with pytest.raises(BackendError, match="does not exist"):
        load_model(ModelConfig(path=str(tmp_path / "missing")))


def test_an_unreachable_endpoint_is_a_backend_error_not_a_traceback(monkeypatch):
    from kbench.backends import BackendError, build_backend

    monkeypatch.setenv("KBENCH_TEST_KEY", "x")
    backend = build_backend(ModelConfig(backend="openai", path="m", base_url="http://u:secret@127.0.0.1:9/v1",
                                        api_key_env="KBENCH_TEST_KEY", request_timeout_s=5))
    with pytest.raises(BackendError, match=r"cannot reach the OpenAI-compatible endpoint http://\*\*\*@127.0.0.1:9/v1") as error:
        backend.generate([[{"role": "user", "content": "hi"}]], stop=[], max_new_tokens=8)
    assert "secret" not in str(error.value)


# -- corpus files ---------------------------------------------------------------------------------
@pytest.fixture
def corpus_dir(small_corpus, tmp_path):  # noqa: F811
    folder = tmp_path / "corpus"
    write_corpus(small_corpus, folder)
    return folder


def _score_corpus(capsys, folder: Path, tmp_path: Path, names: str) -> str:
    """`kbench corpus` importing `folder` (the stage a user runs on a corpus of their own)."""
    params = _params(tmp_path, corpus={"source": str(folder)}, model={"path": str(tmp_path)})
    (tmp_path / "config.json").write_text("{}")  # a model folder as far as the design check goes
    return one_line_error(capsys, "--params", str(params), "corpus", "--out", str(tmp_path / "out"), "--no-track",
                          names=names)


def test_a_json_array_line_in_the_queries_is_named_by_file_and_line(capsys, corpus_dir, tmp_path):
    path = corpus_dir / QUERIES_FILE
    lines = path.read_text().splitlines()
    lines[2] = "[1, 2, 3]"
    path.write_text("\n".join(lines) + "\n")
    _score_corpus(capsys, corpus_dir, tmp_path, names=f"{path}:3: a record must be a JSON object")


def test_a_distractor_without_id_is_named_by_file_and_line(capsys, corpus_dir, tmp_path):
    path = corpus_dir / DISTRACTORS_FILE
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    del rows[1]["id"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _score_corpus(capsys, corpus_dir, tmp_path, names=f"{path}:2: a distractor needs a string 'id'")


def test_a_non_utf8_byte_is_named_by_file_and_line(capsys, corpus_dir, tmp_path):
    path = corpus_dir / FACTS_FILE
    data = path.read_bytes().split(b"\n")
    data[4] = data[4][:10] + b"\xff" + data[4][10:]
    path.write_bytes(b"\n".join(data))
    _score_corpus(capsys, corpus_dir, tmp_path, names=f"{path}:5: not UTF-8 text (byte 0xff at column 11)")


def test_a_wrong_ground_truth_names_the_file_and_line(capsys, corpus_dir, tmp_path):
    path = corpus_dir / QUERIES_FILE
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[6]["ground_truth"] = "somewhere else"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _score_corpus(capsys, corpus_dir, tmp_path, names=f"{path}:7: query {rows[6]['query_id']}'s ground_truth disagrees")


def test_a_corpus_source_that_is_a_file_is_called_a_file(capsys, tmp_path):
    source = tmp_path / "corpus.jsonl"
    source.write_text("{}\n")
    _score_corpus(capsys, source, tmp_path, names=f"corpus source {source} is a file")


# -- the index ------------------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncate-faiss", "bad-passage"])
def test_a_damaged_index_is_refused_naming_the_file(index_dir, tmp_path, damage):  # noqa: F811
    import shutil

    from kbench import io
    from kbench.substrates.text_index import INDEX_FILE, PASSAGES_FILE, TextIndex

    copy = tmp_path / "index"
    shutil.copytree(index_dir, copy)
    if damage == "truncate-faiss":
        data = (copy / INDEX_FILE).read_bytes()
        (copy / INDEX_FILE).write_bytes(data[: len(data) // 2])
        name = INDEX_FILE
    else:
        (copy / PASSAGES_FILE).write_text('{"doc_id": 1}\n')
        name = PASSAGES_FILE
    with pytest.raises(io.IntegrityError, match=re.escape(str(copy / name)) + ": content hash"):
        TextIndex.load(copy)
    io.write_hashes(copy)  # even when the hashes are made to agree, the file is refused by name
    with pytest.raises(io.IntegrityError, match=re.escape(str(copy / name))):
        TextIndex.load(copy)


# -- traces ---------------------------------------------------------------------------------------
def test_unreadable_trace_files_are_named_by_file_and_line(capsys, tmp_path):
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    one_line_error(capsys, "score", str(binary), names=f"{binary}:1: not UTF-8 text")
    nested = tmp_path / "nested.jsonl"
    nested.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    one_line_error(capsys, "score", str(nested), names=f"{nested}:1:")
    deep = tmp_path / "deep.jsonl"
    record = json.loads(trace().model_dump_json())
    record["extra"] = json.loads("[" * 500 + "]" * 500)
    deep.write_text(json.dumps(record) + "\n")
    status, _, err = run(capsys, "score", str(deep))
    assert status in (0, 2) and "Traceback" not in err


def test_duplicate_queries_are_refused_and_mixtures_warned(capsys, tmp_path):
    records = [leaking("Z_answer", query=i) for i in range(3)]
    path = write_jsonl(tmp_path / "cell.jsonl", records)
    again = write_jsonl(tmp_path / "again.jsonl", records[:1])
    one_line_error(capsys, "score", str(path), str(again), names=f"appears in {path} and {again}")
    twice = write_jsonl(tmp_path / "twice.jsonl", [*records, records[0]])
    one_line_error(capsys, "score", str(twice), names=f"appears twice in {twice}")
    both = write_jsonl(tmp_path / "both.jsonl", [*records, trace(query=50, split="retain")])
    status, _, err = run(capsys, "score", str(both))
    assert status == 0 and "warning: pooling 2 splits (forget, retain)" in err
    status, out, err = run(capsys, "score", str(both), "--allow-mixed")
    assert status == 0 and err == ""
    status, out, _ = run(capsys, "score", str(both), "--split", "forget", "--json")
    assert status == 0 and json.loads(out)["n"] == 3


def test_verdict_checks_each_file_against_its_role(capsys, tmp_path):
    none_forget = write_jsonl(tmp_path / "nf.jsonl", [leaking("Z_answer", query=i) for i in range(4)])
    none_retain = write_jsonl(tmp_path / "nr.jsonl", [trace(query=10 + i, split="retain") for i in range(4)])
    method_forget = write_jsonl(tmp_path / "mf.jsonl", [trace(query=i, method="eco") for i in range(4)])
    method_retain = write_jsonl(tmp_path / "mr.jsonl", [trace(query=10 + i, split="retain", method="eco")
                                                         for i in range(4)])
    one_line_error(capsys, "verdict", "--none-forget", str(none_forget), "--none-retain", str(none_retain),
                   "--method-forget", str(none_forget), "--method-retain", str(method_retain),
                   names="--method-forget: " + str(none_forget) + " holds records of method none")
    one_line_error(capsys, "verdict", "--none-forget", str(none_retain), "--none-retain", str(none_retain),
                   "--method-forget", str(method_forget), "--method-retain", str(method_retain),
                   names="--none-forget: " + str(none_retain) + " holds retain records")
    status, _, err = run(capsys, "verdict", "--none-forget", str(none_forget), "--none-retain", str(none_retain),
                         "--method-forget", str(method_forget), "--method-retain", str(method_retain))
    assert status == 0, err


# -- cell folders and the debug switch --------------------------------------------------------------
@pytest.mark.parametrize("content", ["", '{"dig', "[1]", '{"other": 1}'])
def test_an_unreadable_inputs_json_starts_the_cell_over_instead_of_blocking_it(tmp_path, content):
    cell = tmp_path / "cell"
    cell.mkdir()
    (cell / INPUTS_FILE).write_text(content)
    (cell / "traces.jsonl").write_text("{}\n")
    open_unit(cell, {"digest": "a"}, what="its cell")
    assert not (cell / "traces.jsonl").exists()
    assert json.loads((cell / INPUTS_FILE).read_text())["digest"] == "a"


def test_debug_shows_the_traceback(tmp_path):
    absent = tmp_path / "absent.jsonl"
    with pytest.raises(FileNotFoundError):
        main(["--debug", "score", str(absent)])


@pytest.mark.parametrize(("sections", "names"), [
    ({"methods": ["none", "bogus"]}, "unknown method(s) ['bogus']"),
    ({"substrates": ["C", "Q-fake"]}, "unknown substrate(s) ['Q-fake']"),
    ({"seeds": [0, 0]}, "key 'seeds': [0] listed more than once"),
    ({"substrates": []}, "key 'substrates': empty"),
    ({"methods": []}, "key 'methods': empty"),
    ({"p_recipes": []}, "method 'gold' acts on ['P'], none of which is in the design"),
    ({"queries": {"n_per_split": 900}}, "key 'queries.n_per_split': 900 queries per split"),
    ({"model": {"backend": "openai", "path": "m", "base_url": "http://u:pw@127.0.0.1:9/v1"}, "p_recipes": [],
      "methods": ["none"], "agent_base": {"enabled": False}},
     "nothing answers at http://***@127.0.0.1:9/v1"),
])
def test_a_bad_design_is_refused_by_kbench_params_before_any_stage(capsys, tmp_path, sections, names):
    err = one_line_error(capsys, "--params", str(_params(tmp_path, **sections)), "params", names=names)
    assert "pw" not in err


def test_agent_base_with_a_bad_model_path_is_one_line(capsys, corpus_dir, tmp_path):
    absent = tmp_path / "no-such-model"
    params = _params(tmp_path, model={"path": str(absent)})
    one_line_error(capsys, "--params", str(params), "agent-base", "--corpus", str(corpus_dir), "--no-track",
                   names=f"model folder {absent} does not exist")


def test_probes_of_an_unknown_model_is_one_line_listing_the_designs(capsys, corpus_dir, tmp_path, tiny_model_dir):
    params = _params(tmp_path, model={"path": str(tiny_model_dir)}, agent_base={"enabled": False},
                     methods=["none", "gold"], probes={"out_dir": str(tmp_path / "probes")})
    err = one_line_error(capsys, "--params", str(params), "probes", "--corpus", str(corpus_dir), "--no-track",
                         "--model", "P__lora__nope", names="unknown probed model(s) ['P__lora__nope']")
    assert "P__lora__gold" in err and "agent-base" in err
