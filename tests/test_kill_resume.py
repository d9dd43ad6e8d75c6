"""A SIGKILL at the default batch size loses only the trajectories in flight (issue 14).

A subprocess runs one cell of 12 queries at `agent.batch_size: 16` on a scripted backend
whose trajectories take one to three steps; it is killed with SIGKILL as soon as the first
record is on disk. The rerun resumes, and the file is byte-identical to an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).parent

SCRIPT = """
import sys, time, zlib
sys.path.insert(0, {tests!r})
from _agent_fixtures import ScriptedBackend
from kbench.agent import ReActAgent
from kbench.agent.runner import run_cell
from kbench.backends import Generation
from kbench.config import CorpusConfig, Params
from kbench.corpus import generate_corpus
from kbench.methods import MethodContext, build_method
from kbench.substrates import build_substrate


class Paced(ScriptedBackend):
    # A query's trajectory takes 1 to 3 steps (by its id); each call sleeps, so a kill lands mid-cell.
    def generate(self, conversations, *, stop, max_new_tokens, **_):
        time.sleep({pause})
        out = []
        for conversation in conversations:
            if not stop:
                out.append(Generation("Summary of " + conversation[-1]["content"][-40:]))
                continue
            turns = sum(m["role"] == "assistant" for m in conversation)
            length = 1 + zlib.crc32(conversation[1]["content"].encode()) % 3
            out.append(Generation("Final Answer: done" if turns + 1 >= length else
                                  "Thought: look.\\nAction: lookup_record[Nobody, employer]"))
        return out


corpus = generate_corpus(CorpusConfig(n_entities=120))
params = Params()
assert params.agent.batch_size == 16
items = [(q, "forget") for q in corpus.sample_queries("forget", 6, 0)]
items += [(q, "retain") for q in corpus.sample_queries("retain", 6, 0)]
agent = ReActAgent(Paced([]), build_substrate("R-struct", corpus, params.agent, seed=0),
                   build_method("none", MethodContext(corpus, params, 0)), params.agent, seed=0)
run_cell(agent, items, sys.argv[1], progress=False)
"""


def _run(path: Path, pause: float) -> subprocess.Popen:
    code = SCRIPT.format(tests=str(TESTS), pause=pause)
    return subprocess.Popen([sys.executable, "-c", code, str(path)], env={**os.environ, "PYTHONHASHSEED": "0"})


def test_a_sigkill_after_the_first_record_keeps_it_and_the_rerun_is_byte_identical(tmp_path):
    reference = tmp_path / "uninterrupted.jsonl"
    assert _run(reference, 0.0).wait(timeout=120) == 0
    assert len(reference.read_text().splitlines()) == 12

    killed = tmp_path / "killed.jsonl"
    process = _run(killed, 0.3)
    deadline = time.monotonic() + 120
    while not (killed.exists() and killed.read_text().count("\n") >= 1):
        assert process.poll() is None, "the cell ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    kept = killed.read_text().count("\n")
    assert 1 <= kept < 12  # finished records survive the kill; the cell was not done

    assert _run(killed, 0.0).wait(timeout=120) == 0
    assert killed.read_bytes() == reference.read_bytes()
