"""The memory systems under test (docs/memory.md, "Memory systems"), behind one interface, one registered file each.

A system is fed the dialogue turn by turn (`write`), told when a session ends, and answers
questions from what it keeps (`contexts`: the prompt each question is answered from; the
answers of one version are decoded in one batch). A forget request is a user turn like any
other: the system handles it with its own primitives, and notes each memory operation it
carries out (`record`: the probe traces' tool arguments). `failures` counts memory operations
the model did not produce in a readable form (reported, never a crash). `kbench list memory-systems`
shows the registered ones.

A new system is one module with a class decorated by `register_memory_system`, and no other file
changes (docs/memory.md, "Adding a memory system"): a module in this package, found by scanning
it, or a module of your own project named in an entry point of the group `kbench.memory_systems`
(`[project.entry-points."kbench.memory_systems"]`, `my-memory = "my_package.my_memory"`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from kbench.backends import Backend, Conversation, Message
from kbench.memory.instances import Instance, Probe, Session, Turn
from kbench.memory.channels import MemoryTrace, probe_trace
from kbench.memory.records import CONTROL_VERSION, FORGET_VERSION, ItemRecord
from kbench.registry import Registry, import_entry_points, import_package_and_plugins

#: Probes answered in one batch: a whole version's probes over a long transcript held about
#: 9.5 GB in one worker (BENCHMARKS.md, memory lane); batches of this size bound it.
ANSWER_BATCH = 16
#: What every system's answering prompt starts with.
ASSISTANT = "You are a personal assistant. Answer the user's question briefly, from what you know about them."


class MemorySystemError(ValueError):
    """An unknown memory system, or one that cannot run here."""


@dataclass(frozen=True)
class LlmEndpoint:
    """An OpenAI-compatible chat endpoint a memory library makes its own LLM calls to."""

    #: The API root, e.g. http://127.0.0.1:8080/v1.
    base_url: str
    #: The model name sent with each request.
    model: str
    #: Tokens one call may write.
    max_tokens: int = 256
    #: The API key sent (a local server ignores it).
    api_key: str = "local"


class MemorySystem(ABC):
    """One way of keeping a user's facts across sessions."""

    name: ClassVar[str]
    #: True for a system whose library makes its own LLM calls to an `LlmEndpoint` (the stage
    #: starts a local server for it unless `memory.llm_base_url` names one).
    needs_endpoint: ClassVar[bool] = False

    def __init__(self, backend: Backend, *, max_new_tokens: int = 48, endpoint: LlmEndpoint | None = None) -> None:
        self.backend = backend
        self.max_new_tokens = max_new_tokens
        self.endpoint = endpoint
        #: Memory operations the model wrote in no readable form.
        self.failures = 0
        #: The memory writes it carried out, as text, each with the session (0-based) it was made in.
        self.operations: list[tuple[int, str]] = []
        #: The session being fed (`feed` sets it).
        self.session = 0

    def record(self, operation: str) -> None:
        """Note one memory write (an add, an update, a rewrite, a stored turn) of the current session."""
        self.operations.append((self.session, operation))

    def dialogue(self, instance: Instance, version: str) -> list[Session]:
        """The sessions this system is fed: the instance's `version` (the reference rebuilds it)."""
        return instance.forget if version == FORGET_VERSION else instance.control

    def close(self) -> None:
        """Release what the system holds (files, connections); it is not used afterwards."""

    @abstractmethod
    def write(self, turn: Turn, *, day: str) -> None:
        """Take in one turn of the dialogue."""

    def end_session(self, day: str) -> None:
        """A session is over (a system that consolidates does it here)."""

    @abstractmethod
    def contexts(self, questions: Sequence[str]) -> list[Conversation]:
        """The prompt each question is answered from."""

    def memory(self) -> str:
        """What the system keeps, as text (the trace's view of its memory)."""
        return ""

    def generate(self, conversations: Sequence[Conversation], max_new_tokens: int | None = None) -> list[str]:
        out = self.backend.generate(conversations, stop=[], max_new_tokens=max_new_tokens or self.max_new_tokens)
        return [g.text.strip() for g in out]

    def respond(self, questions: Sequence[str]) -> list[tuple[str, str]]:
        """(reply, what memory put in front of the model) per question, decoded `ANSWER_BATCH` at
        a time: the answering prompt without the common instruction and the question itself."""
        answered: list[tuple[str, str]] = []
        for start in range(0, len(questions), ANSWER_BATCH):
            contexts = self.contexts(questions[start:start + ANSWER_BATCH])
            answered += zip(self.generate(contexts), (_supplied(c) for c in contexts))
        return answered

    def answer(self, questions: Sequence[str]) -> list[str]:
        """The replies to `questions`."""
        return [reply for reply, _ in self.respond(questions)]


def _supplied(conversation: Conversation) -> str:
    """What a system's prompt holds besides `ASSISTANT` and the question (its last message)."""
    texts = [m["content"] for m in conversation[:-1]]
    if texts and texts[0].startswith(ASSISTANT):
        texts[0] = texts[0][len(ASSISTANT):].strip()
    return "\n".join(t for t in texts if t)


def ask(system_prompt: str, question: str) -> Conversation:
    return [Message(role="system", content=system_prompt), Message(role="user", content=question)]


_SYSTEMS: Registry[type[MemorySystem]] = Registry("memory system", MemorySystemError)


def register_memory_system(name: str) -> Callable[[type[MemorySystem]], type[MemorySystem]]:
    def decorate(cls: type[MemorySystem]) -> type[MemorySystem]:
        cls.name = name
        _SYSTEMS.add(name, cls)
        return cls

    return decorate


def unregister_memory_system(name: str) -> None:
    """Forget a registered memory system (a test's plugin, when it is done)."""
    _SYSTEMS.remove(name)


#: The entry-point group a distribution names its memory-system modules in.
ENTRY_POINT_GROUP = "kbench.memory_systems"


def load_plugins() -> list[str]:
    """Import every module named in the `kbench.memory_systems` entry points (in name order),
    which registers its systems; returns the modules. The first lookup of a system runs it."""
    return import_entry_points(ENTRY_POINT_GROUP)


def _load() -> None:
    """Import every module of this package, then (once) the plugins: each registers its entry."""
    import_package_and_plugins(__name__, __path__, ENTRY_POINT_GROUP)


def memory_system_names() -> list[str]:
    _load()
    return _SYSTEMS.names()


def memory_system_class(name: str) -> type[MemorySystem]:
    _load()
    return _SYSTEMS.get(name)


def feed(system: MemorySystem, instance: Instance, version: str) -> MemorySystem:
    """The instance's dialogue in `version`, turn by turn, session by session."""
    for number, session in enumerate(system.dialogue(instance, version)):
        system.session = number
        for turn in session.turns:
            system.write(turn, day=session.date)
        system.end_session(session.date)
    return system


@dataclass(frozen=True)
class InstanceRun:
    """One system on one instance: what `run_instance` returns."""

    #: One item record per probe, in the instance's probe order.
    items: list[ItemRecord]
    #: Memory operations the model wrote in no readable form (both versions).
    failures: int
    #: What the system kept after each version's dialogue (`MemorySystem.memory`), by version.
    memories: dict[str, str]
    #: Each probe reply as a trace record the six-channel observer reads, in `items` order.
    traces: list[MemoryTrace]


def run_instance(make: Callable[[], MemorySystem], instance: Instance) -> InstanceRun:
    """Every probe of the instance answered by a fresh system per version."""
    answered: list[tuple[ItemRecord, MemoryTrace]] = []
    failures = 0
    memories = {}
    since = min((r.session for r in instance.requests), default=0)  # the operations a trace shows
    for version in (CONTROL_VERSION, FORGET_VERSION):
        probes = [p for p in instance.probes if p.version == version]
        system = make()
        try:
            feed(system, instance, version)
            memories[version] = system.memory()
            replies = system.respond([p.question for p in probes])
        finally:
            system.close()
        operations = [text for session, text in system.operations if session >= since]
        for probe, (reply, supplied) in zip(probes, replies):
            item = probe.item(instance, system.name, reply)
            answered.append((item, probe_trace(item, question=probe.question, supplied=supplied,
                                               operations=operations, kept=memories[version])))
        failures += system.failures
    def slot(p: Probe | ItemRecord) -> tuple[str, ...]:  # a probe and its item record share it
        return p.probe_id, p.suite, p.version, p.attack or ""

    order = {slot(p): i for i, p in enumerate(instance.probes)}
    answered.sort(key=lambda pair: order[slot(pair[0])])
    return InstanceRun([item for item, _ in answered], failures, memories, [trace for _, trace in answered])


__all__ = ["ASSISTANT", "InstanceRun", "LlmEndpoint", "MemorySystem", "MemorySystemError", "ask", "feed", "memory_system_class",
           "memory_system_names", "register_memory_system", "run_instance", "ENTRY_POINT_GROUP", "load_plugins",
           "unregister_memory_system"]
