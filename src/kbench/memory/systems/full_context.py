"""`full-context`: the whole dialogue, every session, stays in the prompt as a dated transcript;
forgetting is left to the model reading the requests in it. The transcript sits in the system
prompt rather than as chat turns: as turns, a small model answers by repeating the dialogue's
own assistant replies instead of reading it."""

from __future__ import annotations

from collections.abc import Sequence

from kbench.backends import Conversation
from kbench.memory.instances import Turn
from kbench.memory.systems import ASSISTANT, MemorySystem, ask, register_memory_system

_SPEAKER = {"user": "User", "assistant": "Assistant"}


@register_memory_system("full-context")
class FullContext(MemorySystem):
    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.lines: list[str] = []

    def write(self, turn: Turn, *, day: str) -> None:
        self.lines.append(f"[{day}] {_SPEAKER[turn.role]}: {turn.content}")
        self.record(f"APPEND {self.lines[-1]}")

    def contexts(self, questions: Sequence[str]) -> list[Conversation]:
        transcript = "\n".join(self.lines)
        return [ask(f"{ASSISTANT}\n\nYour conversations with the user so far:\n{transcript}", q) for q in questions]

    def memory(self) -> str:
        return "\n".join(self.lines)
