"""Mem0's forget path through Mem0's own API, with a scripted model behind an OpenAI-compatible
stub and the project's sentence embeddings: facts go in through `Memory.add`, a forget request
follows, and Mem0's store (`get_all`, `search`) is read afterwards. `mem0-app` deletes what the
request covers (Mem0's `search` and `delete`, the model choosing) and keeps the rest; Mem0 as
shipped (`mem0`, add only) still holds it. An unreadable choice is counted and deletes nothing."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from kbench.memory.instances import Turn
from kbench.memory.systems import LlmEndpoint, memory_system_class
from kbench.memory.systems.mem0 import USER
from kbench.memory.systems.mem0_app import FORGET_PROMPT, MAX_REPLY, chosen

from _chat_stub import ChatStub, serving
from test_memory_systems import EchoBackend

FIRST, SECOND = "2026-11-02", "2026-11-09"


class ScriptedModel(ChatStub):
    """Mem0's extraction: one memory "User's X is V" per "my X is V" of the new messages. The
    forget choice: the shown memories that name the requested kind; a request about the favorite
    color gets an unreadable reply. Each forget call's prompt is kept in `forget_calls`."""

    forget_calls: list[str] = []

    def answer(self, body: dict[str, Any]) -> str:
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if system == FORGET_PROMPT:
            self.forget_calls.append(user)
            kind = re.search(r"forget my ([a-z' ]+)", user)[1]
            if kind == "favorite color":
                return "Sure, I have forgotten it."
            shown = re.findall(r"^(\d+)\. \[[^\]]*\] (.*)$", user, re.MULTILINE)
            return json.dumps({"delete": [int(n) for n, text in shown if kind in text]})
        said = user.split("## New Messages", 1)[1].split("## Observation Date", 1)[0]
        facts = re.findall(r"my ([a-z' ]+?) is ([^.\n]+)", said)
        return json.dumps({"memory": [{"id": str(n), "text": f"User's {k} is {v}"} for n, (k, v) in enumerate(facts)]})


@pytest.fixture(scope="module")
def endpoint():
    with serving(ScriptedModel) as base_url:
        yield LlmEndpoint(base_url, "scripted")


def _session(system, day: str, *said: str) -> None:
    for text in said:
        system.write(Turn(role="user", content=text), day=day)
        system.write(Turn(role="assistant", content="Got it."), day=day)
    system.end_session(day)


def _held(system) -> set[str]:
    return {hit["memory"] for hit in system.store.get_all(filters={"user_id": USER})["results"]}


def test_mem0_app_deletes_what_a_request_covers_and_mem0_as_shipped_keeps_it(endpoint):
    held, found, failures = {}, {}, {}
    for name in ("mem0", "mem0-app"):
        ScriptedModel.forget_calls.clear()
        system = memory_system_class(name)(EchoBackend(), endpoint=endpoint)
        try:
            _session(system, FIRST, "By the way, my hobby is pottery.", "By the way, my favorite color is teal.")
            assert _held(system) == {"User's hobby is pottery", "User's favorite color is teal"}
            assert [op for _, op in system.operations] == ["ADD User's hobby is pottery",
                                                           "ADD User's favorite color is teal"]
            _session(system, SECOND, "Please forget my hobby.", "By the way, my hobby is chess.",
                     "Please forget my favorite color.")
            held[name] = _held(system)
            found[name] = [hit["memory"] for hit in
                           system.store.search("What is my hobby?", filters={"user_id": USER})["results"]]
            failures[name] = system.failures
            calls = list(ScriptedModel.forget_calls)
        finally:
            system.close()
    # Mem0 as shipped: the request went through `Memory.add`, which only adds; the fact stays
    assert held["mem0"] == {"User's hobby is pottery", "User's hobby is chess", "User's favorite color is teal"}
    assert "User's hobby is pottery" in found["mem0"] and failures["mem0"] == 0
    # the application: Mem0's search found the memory, the model chose it, Mem0's delete removed it;
    # the value stated after the request stays, and the unreadable choice deleted nothing
    assert held["mem0-app"] == {"User's hobby is chess", "User's favorite color is teal"}
    assert "User's hobby is chess" in found["mem0-app"] and "User's hobby is pottery" not in found["mem0-app"]
    assert failures["mem0-app"] == 1
    # two choices, each shown the memories Mem0's search found, dated by the session they came from
    assert len(calls) == 2 and f"[{FIRST}] User's hobby is pottery" in calls[0]
    assert calls[1].startswith("The user's request: Please forget my favorite color.")
    assert f"[{FIRST}] User's favorite color is teal" in calls[1]


def test_a_choice_is_read_as_data():
    assert chosen('{"delete": [2, "0", 2]}', 3) == [0, 2]
    assert chosen('```json\n{"delete": []}\n```', 3) == []
    assert chosen('Here you go: {"delete": [1]} done', 3) == [1]
    for bad in ('{"delete": [3]}', '{"delete": "0"}', '[0]', 'Sure.', '', '{"delete": [true]}', '{"delete": [-1]}',
                '{"delete": [0.5]}', " " * MAX_REPLY + '{"delete": [0]}'):  # read up to MAX_REPLY characters
        assert chosen(bad, 3) is None, bad
