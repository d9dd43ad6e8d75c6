"""run_cell: traces appended as they finish, resume after a crash, never a duplicate query."""

import json

import pytest

from _agent_fixtures import ScriptedBackend, params, small_corpus  # noqa: F401  (fixtures)
from kbench.agent import ReActAgent
from kbench.methods import MethodContext, build_method
from kbench.records import iter_traces
from kbench.agent.runner import run_cell
from kbench.substrates import build_substrate


def make_agent(backend, corpus, params, substrate="R-struct", seed=0):  # noqa: F811
    config = params.agent.model_copy(update={"batch_size": 2})
    return ReActAgent(
        backend, build_substrate(substrate, corpus, config, seed=seed),
        build_method("none", MethodContext(corpus, params, seed)), config, seed=seed,
    )


@pytest.fixture
def items(small_corpus):  # noqa: F811
    forget = small_corpus.sample_queries("forget", 3, 0)
    retain = small_corpus.sample_queries("retain", 3, 0)
    return [(q, "forget") for q in forget] + [(q, "retain") for q in retain]


class CrashingBackend(ScriptedBackend):
    """Dies on its n-th generate call, like a killed process."""

    def __init__(self, crash_at: int):
        super().__init__(["Final Answer: x"])
        self.crash_at = crash_at

    def generate(self, conversations, *, stop, max_new_tokens, **_):
        if len(self.calls) + 1 == self.crash_at:
            raise KeyboardInterrupt
        return super().generate(conversations, stop=stop, max_new_tokens=max_new_tokens)


def test_records_are_written_and_returned(small_corpus, params, items, tmp_path):  # noqa: F811
    path = tmp_path / "traces.jsonl"
    records = run_cell(make_agent(ScriptedBackend(["Final Answer: x"]), small_corpus, params), items, path, progress=False)
    assert [r.query_id for r in iter_traces(path)] == [r.query_id for r in records]
    assert sorted(r.query_id for r in records) == sorted(q.query_id for q, _ in items)
    assert {r.split for r in records} == {"forget", "retain"}


def test_resume_after_a_crash_never_duplicates(small_corpus, params, items, tmp_path):  # noqa: F811
    path = tmp_path / "traces.jsonl"
    with pytest.raises(KeyboardInterrupt):
        # batch 2: step, summary (2 records written), step, then the crash
        run_cell(make_agent(CrashingBackend(crash_at=4), small_corpus, params), items, path, progress=False)
    written = [r.query_id for r in iter_traces(path)]
    assert len(written) == 2
    # the process died in the middle of writing a third record
    with path.open("a") as handle:
        handle.write('{"query_id": "pii-00099::address", "entity_')
    resumed_backend = ScriptedBackend(["Final Answer: x"])
    records = run_cell(make_agent(resumed_backend, small_corpus, params), items, path, progress=False)
    ids = [r.query_id for r in iter_traces(path)]
    assert len(ids) == len(set(ids)) == len(items)
    assert ids[:2] == written
    assert sum(resumed_backend.calls) == 2 * (len(items) - 2)  # only the missing queries ran
    assert [r.query_id for r in records] == ids
    # a third run has nothing to do
    idle = ScriptedBackend(["Final Answer: x"])
    assert len(run_cell(make_agent(idle, small_corpus, params), items, path, progress=False)) == len(items)
    assert idle.calls == []


def test_a_complete_last_line_without_newline_is_kept(small_corpus, params, items, tmp_path):  # noqa: F811
    path = tmp_path / "traces.jsonl"
    run_cell(make_agent(ScriptedBackend(["Final Answer: x"]), small_corpus, params), items[:2], path, progress=False)
    path.write_text(path.read_text().rstrip("\n"))
    run_cell(make_agent(ScriptedBackend(["Final Answer: x"]), small_corpus, params), items, path, progress=False)
    lines = path.read_text().splitlines()
    assert len(lines) == len(items) and all(json.loads(line) for line in lines)


def test_a_trace_file_of_another_cell_is_refused(small_corpus, params, items, tmp_path):  # noqa: F811
    path = tmp_path / "traces.jsonl"
    run_cell(make_agent(ScriptedBackend(["Final Answer: x"]), small_corpus, params), items[:1], path, progress=False)
    with pytest.raises(ValueError, match="holds a trace of cell"):
        run_cell(make_agent(ScriptedBackend(["Final Answer: x"]), small_corpus, params, substrate="C"), items, path,
                 progress=False)


def test_a_corrupt_line_in_the_middle_is_an_error(small_corpus, params, items, tmp_path):  # noqa: F811
    path = tmp_path / "traces.jsonl"
    run_cell(make_agent(ScriptedBackend(["Final Answer: x"]), small_corpus, params), items[:2], path, progress=False)
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n{broken\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match=r"traces.jsonl:2: not valid JSON"):
        run_cell(make_agent(ScriptedBackend(["Final Answer: x"]), small_corpus, params), items, path, progress=False)
