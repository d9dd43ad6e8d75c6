"""`naive-rag`: the user's turns in a vector index (the project's sentence embeddings, FAISS);
a question is answered from the closest ones. A forget request is one more indexed turn."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kbench.backends import Conversation
from kbench.memory.instances import Turn
from kbench.memory.systems import ASSISTANT, MemorySystem, ask, register_memory_system
from kbench.substrates.text_index import embed

#: Turns retrieved per question.
TOP_K = 4


@register_memory_system("naive-rag")
class NaiveRag(MemorySystem):
    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.texts: list[str] = []

    def write(self, turn: Turn, *, day: str) -> None:
        if turn.role == "user":
            self.texts.append(f"[{day}] {turn.content}")
            self.record(f"INDEX {self.texts[-1]}")

    def retrieve(self, questions: Sequence[str]) -> list[list[str]]:
        import faiss

        if not self.texts:
            return [[] for _ in questions]
        index = faiss.IndexFlatIP(384)
        index.add(embed(self.texts))
        _, found = index.search(embed(list(questions)), min(TOP_K, len(self.texts)))
        return [[self.texts[i] for i in sorted(row) if i >= 0] for row in np.asarray(found)]

    def contexts(self, questions: Sequence[str]) -> list[Conversation]:
        memories = self.retrieve(questions)
        return [ask(ASSISTANT + "\n\nWhat the user told you (most relevant first is not guaranteed):\n"
                    + "\n".join(f"- {m}" for m in found), q) for q, found in zip(questions, memories)]

    def memory(self) -> str:
        return "\n".join(self.texts)
