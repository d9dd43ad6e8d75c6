"""`fact-store`: facts the model maintains in SQLite with add / update / delete / no-op operations
after each session, from what the user said in it (Mem0's design, fed as `mem0` is: one update
per session); a question is answered from the stored facts. Operations
come from the model: parsed as data, bound as SQL parameters, bounded in size; a line that is
no operation counts as a failure."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence

from kbench.backends import Conversation
from kbench.memory.instances import Turn
from kbench.memory.systems import ASSISTANT, MemorySystem, ask, register_memory_system

OPERATIONS = ("You maintain a list of facts about the user. After each conversation, reply with memory "
              "operations, one per line, and nothing else:\nADD <fact>\nUPDATE <number> <fact>\n"
              "DELETE <number>\nNONE\nDelete the facts the user asks you to forget.")
#: The longest fact stored (a model's text is untrusted).
MAX_FACT_CHARS = 300
_OPERATION = re.compile(r"^\s*(ADD|UPDATE|DELETE|NONE)\b\s*(\d+)?\s*[:.-]?\s*(.*)$", re.IGNORECASE)


@register_memory_system("fact-store")
class FactStore(MemorySystem):
    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.db = sqlite3.connect(":memory:")
        self.db.execute("CREATE TABLE facts (id INTEGER PRIMARY KEY, text TEXT NOT NULL)")
        self.said: list[str] = []

    def facts(self) -> list[tuple[int, str]]:
        return list(self.db.execute("SELECT id, text FROM facts ORDER BY id"))

    def listing(self) -> str:
        return "\n".join(f"{i}. {text}" for i, text in self.facts()) or "(none)"

    def write(self, turn: Turn, *, day: str) -> None:
        if turn.role == "user":
            self.said.append(turn.content)

    def end_session(self, day: str) -> None:
        if not self.said:
            return
        lines = "\n".join(f'- "{text}"' for text in self.said)
        prompt = f"Stored facts:\n{self.listing()}\n\nToday ({day}) the user said:\n{lines}\n\nOperations:"
        (reply,) = self.generate([ask(OPERATIONS, prompt)], max_new_tokens=96)
        self.apply(reply)
        self.said = []

    def apply(self, reply: str) -> None:
        """Carry out the operations of a model reply; count each line that is none."""
        lines = [line for line in reply.splitlines() if line.strip()] or [""]
        for line in lines:
            found = _OPERATION.match(line)
            if found is None:
                self.failures += 1
                continue
            verb, number, text = found[1].upper(), found[2], found[3].strip()[:MAX_FACT_CHARS]
            if verb == "ADD" and (text or number):
                fact = f"{number or ''} {text}".strip()
                self.db.execute("INSERT INTO facts (text) VALUES (?)", (fact,))
                self.record(f"ADD {fact}")
            elif verb == "UPDATE" and number and text:
                self.db.execute("UPDATE facts SET text = ? WHERE id = ?", (text, int(number)))
                self.record(f"UPDATE {number} {text}")
            elif verb == "DELETE" and number:
                self.db.execute("DELETE FROM facts WHERE id = ?", (int(number),))
            elif verb != "NONE":
                self.failures += 1

    def contexts(self, questions: Sequence[str]) -> list[Conversation]:
        return [ask(f"{ASSISTANT}\n\nFacts you stored about the user:\n{self.listing()}", q) for q in questions]

    def memory(self) -> str:
        return self.listing()
