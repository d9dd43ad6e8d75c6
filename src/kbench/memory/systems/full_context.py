"""`full-context`: the whole dialogue, every session, stays in the prompt; forgetting is left to
the model reading the requests in it."""

from __future__ import annotations

from collections.abc import Sequence

from kbench.backends import Conversation, Message
from kbench.memory.instances import Turn
from kbench.memory.systems import ASSISTANT, MemorySystem, register_memory_system


@register_memory_system("full-context")
class FullContext(MemorySystem):
    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.turns: list[Message] = []

    def write(self, turn: Turn, *, day: str) -> None:
        self.turns.append(Message(role=turn.role, content=turn.content))

    def contexts(self, questions: Sequence[str]) -> list[Conversation]:
        head = [Message(role="system", content=ASSISTANT), *self.turns]
        return [[*head, Message(role="user", content=q)] for q in questions]

    def memory(self) -> str:
        return "\n".join(m["content"] for m in self.turns if m["role"] == "user")
