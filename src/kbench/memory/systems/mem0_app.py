"""`mem0-app`: the Mem0 library as an application uses it to forget. The dialogue goes to
`Memory.add` as in `mem0` (the same configuration, endpoint and embedder); a user turn that asks
to forget something (it says forget, delete, erase or remove) is carried out with Mem0's own
`Memory.search` (the memories the request may cover, each with the day it was learned) and
`Memory.delete`, the model choosing which of the found memories the request covers in one call
to the same endpoint. A choice that is no JSON object listing shown memories is a failed memory
operation (nothing is deleted)."""

from __future__ import annotations

import re

from kbench.memory.instances import Turn
from kbench.memory.systems import MemorySystemError, register_memory_system
from kbench.memory.systems.mem0 import USER, Mem0, json_object

#: A user turn that asks to forget: the request is carried out before the turn is added.
ASKS_TO_FORGET = re.compile(r"\b(forget|delete|erase|remove)\b", re.IGNORECASE)
#: Memories a request's search returns (Mem0's own default).
FORGET_TOP_K = 20
#: The least similarity a found memory needs: the lowest Mem0 takes (its default, 0.1, hides memories
#: whose words barely resemble the request's, such as F3's named day; the model's choice is the precise step).
FORGET_THRESHOLD = 0.0
#: Characters of the model's choice read (its output is untrusted).
MAX_REPLY = 4000
#: The system prompt of the call that chooses what a request covers.
FORGET_PROMPT = (
    "You manage a personal assistant's memories of its user. The user has just asked it to forget "
    "something. Below are the stored memories the request may cover, numbered, each with the day it was "
    "learned. Choose the memories the request asks to forget, and no others. Reply with a JSON object "
    'only: {"delete": [the numbers]}, an empty list when it covers none.'
)


def chosen(reply: str, shown: int) -> list[int] | None:
    """The memory numbers a reply lists under "delete" (integers or digit strings, each one of the
    `shown`), or None when it is no such object (then nothing is deleted)."""
    data = json_object((reply or "")[:MAX_REPLY])
    numbers = data.get("delete") if data is not None else None
    if not isinstance(numbers, list):
        return None
    picked = set()
    for number in numbers:
        text = str(number).strip() if isinstance(number, (int, str)) and not isinstance(number, bool) else ""
        if not text.isdigit() or int(text) >= shown:
            return None  # a number it was not shown: the choice is unreadable as a whole
        picked.add(int(text))
    return sorted(picked)


@register_memory_system("mem0-app")
class Mem0App(Mem0):
    def write(self, turn: Turn, *, day: str) -> None:
        if turn.role == "user" and ASKS_TO_FORGET.search(turn.content):
            self.add_pending(day)  # what the user said before the request is in the store first
            self.forget(turn.content)
        super().write(turn, day=day)

    def forget(self, request: str) -> None:
        """Search Mem0 for the memories `request` may cover and delete those the model chooses."""
        from openai import OpenAIError

        found = self.store.search(request, top_k=FORGET_TOP_K, threshold=FORGET_THRESHOLD,
                                  filters={"user_id": USER}).get("results", [])
        if not found:
            return
        listing = "\n".join(f"{n}. [{(hit.get('metadata') or {}).get('day', 'unknown day')}] {hit['memory']}"
                            for n, hit in enumerate(found))
        try:
            reply = self.llm_call(messages=[
                {"role": "system", "content": FORGET_PROMPT},
                {"role": "user", "content": f"The user's request: {request}\n\nMemories:\n{listing}"},
            ], response_format={"type": "json_object"})
        except OpenAIError as exc:  # the endpoint failed (not the model's output): stop, one line
            raise MemorySystemError(f"{self.name}'s LLM call to {self.endpoint.base_url} failed: {exc}") from None
        picked = chosen(reply if isinstance(reply, str) else "", len(found))
        if picked is None:
            self.failures += 1
            return
        for number in picked:
            self.store.delete(found[number]["id"])
