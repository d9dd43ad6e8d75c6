"""`mem0`: the Mem0 library (`mem0ai` from PyPI) as its authors ship it. Each session is handed
to `Memory.add`, whose own prompts have the LLM extract memories as JSON through an
OpenAI-compatible endpoint (`LlmEndpoint`: the llama.cpp server the stage starts, or a user's);
a question is answered by the project's model from `Memory.search`'s closest memories. The
project supplies the embedder (its sentence embeddings) and a local FAISS store in a scratch
folder. Forgetting is whatever Mem0's pipeline does with a request turn. An extraction reply that
is no JSON object counts as a failed memory operation (Mem0 itself logs it and stores nothing)."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from contextvars import ContextVar

from kbench.backends import Conversation
from kbench.backends.openai import OpenAIBackend
from kbench.memory.instances import Turn
from kbench.memory.systems import ASSISTANT, MemorySystem, MemorySystemError, ask, register_memory_system
from kbench.substrates.text_index import embedding_model_path

#: Memories retrieved per question.
TOP_K = 4
#: The one user every instance's memories belong to (a fresh store per instance and version).
USER = "user"
_PACKAGE_HINT = "pip install -c constraints.txt mem0ai (make setup installs it)"


#: The day of the session `Memory.add` is extracting (Mem0's prompt otherwise dates it by the
#: wall clock, and the same params would not give the same bytes on another day).
_SESSION_DAY: ContextVar[str | None] = ContextVar("session_day", default=None)


@functools.cache
def _process_dir() -> str:
    """A folder for what Mem0 writes at import (one per process, removed at exit)."""
    folder = tempfile.mkdtemp(prefix="kbench-mem0-home-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _date_extraction_by_session() -> None:
    """Have Mem0's extraction prompt take the session's day as its current date (its own
    `current_date` argument), once per process."""
    import mem0.memory.main as mem0_main

    prompt = mem0_main.generate_additive_extraction_prompt
    if getattr(prompt, "kbench_dated", False):
        return

    def dated(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if kwargs.get("current_date") is None and _SESSION_DAY.get() is not None:
            kwargs["current_date"] = _SESSION_DAY.get()
        return prompt(*args, **kwargs)

    dated.kbench_dated = True
    mem0_main.generate_additive_extraction_prompt = dated


def json_object(reply: str) -> dict | None:
    """The JSON object Mem0's own parser reads in `reply` (the whole text, else its first `{`…`}`
    span), or None."""
    from mem0.memory.utils import extract_json, remove_code_blocks

    text = remove_code_blocks(reply or "")
    for candidate in (text, extract_json(text)):
        try:
            value = json.loads(candidate, strict=False)
        except json.JSONDecodeError:
            continue
        return value if isinstance(value, dict) else None
    return None


def _extracted(reply: str) -> bool:
    """Whether Mem0's own parser reads `reply` as a JSON object (its extraction succeeded)."""
    from mem0.memory.utils import remove_code_blocks

    # an empty reply is Mem0's "nothing to extract"
    return not remove_code_blocks(reply or "").strip() or json_object(reply) is not None


@register_memory_system("mem0")
class Mem0(MemorySystem):
    needs_endpoint = True

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        if self.endpoint is None:
            raise MemorySystemError(f"memory system {self.name} needs an OpenAI-compatible endpoint "
                                    "(memory.llm_base_url, or the llama.cpp server the stage starts)")
        self.scratch = tempfile.TemporaryDirectory(prefix="kbench-mem0-")
        os.environ.setdefault("MEM0_TELEMETRY", "False")  # no events leave the machine
        os.environ.setdefault("MEM0_DIR", _process_dir())  # Mem0's own files, never the user's ~/.mem0
        try:
            from mem0 import Memory
        except ImportError:
            raise MemorySystemError(f"memory system {self.name} needs the mem0ai package: {_PACKAGE_HINT}") from None
        _date_extraction_by_session()
        self.store = Memory.from_config({
            "llm": {"provider": OpenAIBackend.name, "config": {  # Mem0's client of the same API
                "model": self.endpoint.model, "openai_base_url": self.endpoint.base_url,
                "api_key": self.endpoint.api_key, "max_tokens": self.endpoint.max_tokens,
                "temperature": 0.0, "top_p": 1.0}},
            "embedder": {"provider": "huggingface", "config": {
                "model": embedding_model_path(), "embedding_dims": 384, "model_kwargs": {"device": "cpu"}}},
            "vector_store": {"provider": "faiss", "config": {
                "path": os.path.join(self.scratch.name, "faiss"), "embedding_model_dims": 384,
                "distance_strategy": "cosine"}},
            "history_db_path": os.path.join(self.scratch.name, "history.db"),
        })
        #: A call of Mem0's LLM client to the endpoint, not counted (`counted` is what Mem0 itself calls).
        self.llm_call = respond = self.store.llm.generate_response

        def counted(*call_args, **call_kwargs):  # noqa: ANN002, ANN003, ANN202
            reply = respond(*call_args, **call_kwargs)
            if call_kwargs.get("response_format") and not _extracted(reply):
                self.failures += 1
            return reply

        self.store.llm.generate_response = counted
        self.pending: list[dict[str, str]] = []

    def write(self, turn: Turn, *, day: str) -> None:
        self.pending.append({"role": turn.role, "content": turn.content})

    def end_session(self, day: str) -> None:
        self.add_pending(day)

    def add_pending(self, day: str) -> None:
        """Hand the turns taken in since the last add to `Memory.add`, as one conversation of `day`."""
        from mem0.exceptions import LLMError

        if self.pending:
            token = _SESSION_DAY.set(day)
            try:
                added = self.store.add(self.pending, user_id=USER, metadata={"day": day})
            except LLMError as exc:  # the endpoint failed (not the model's output): stop, one line
                raise MemorySystemError(f"mem0's LLM call to {self.endpoint.base_url} failed: {exc}") from None
            finally:
                _SESSION_DAY.reset(token)
            self.pending = []
            for event in added.get("results", []) if isinstance(added, dict) else []:
                if event.get("event") in ("ADD", "UPDATE"):  # its writes (a deletion echoes what it removed)
                    self.record(f"{event['event']} {event.get('memory', '')}")

    def retrieve(self, question: str) -> list[str]:
        found = self.store.search(question, top_k=TOP_K, filters={"user_id": USER})
        return [hit["memory"] for hit in found.get("results", [])]

    def contexts(self, questions: Sequence[str]) -> list[Conversation]:
        return [ask(ASSISTANT + "\n\nYour memories of the user:\n" + "\n".join(f"- {m}" for m in self.retrieve(q)), q)
                for q in questions]

    def memory(self) -> str:
        found = self.store.get_all(filters={"user_id": USER}, top_k=1000)
        return "\n".join(sorted(hit["memory"] for hit in found.get("results", [])))

    def close(self) -> None:
        self.scratch.cleanup()
