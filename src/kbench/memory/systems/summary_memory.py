"""`summary-memory`: a rolling summary of the user that the model rewrites after each session,
asked to honour the session's requests to forget; questions are answered from it alone."""

from __future__ import annotations

from collections.abc import Sequence

from kbench.backends import Conversation
from kbench.memory.instances import Turn
from kbench.memory.systems import ASSISTANT, MemorySystem, ask, register_memory_system

REWRITE = ("You keep a short summary of what you know about the user, one fact per line. Rewrite it after "
           "today's conversation: add what the user told you, change what changed, and remove whatever the "
           "user asked you to forget.")


@register_memory_system("summary-memory")
class SummaryMemory(MemorySystem):
    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.summary = ""
        self.today: list[str] = []

    def write(self, turn: Turn, *, day: str) -> None:
        if turn.role == "user":
            self.today.append(turn.content)

    def end_session(self, day: str) -> None:
        if not self.today:
            return
        request = (f"Summary so far:\n{self.summary or '(empty)'}\n\nToday ({day}) the user said:\n"
                   + "\n".join(f"- {t}" for t in self.today) + "\n\nThe updated summary:")
        (self.summary,) = self.generate([ask(REWRITE, request)], max_new_tokens=128)
        self.record(f"REWRITE {self.summary}")
        self.today = []

    def contexts(self, questions: Sequence[str]) -> list[Conversation]:
        return [ask(f"{ASSISTANT}\n\nWhat you know about the user:\n{self.summary}", q) for q in questions]

    def memory(self) -> str:
        return self.summary
