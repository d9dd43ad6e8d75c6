"""The world a `kbench-sessions` session acts on: the corpus's records (read-only), the agent's
memory notes and an outbox (the consequential tool), with snapshots an operator can restore.

Tool arguments come from the model: they are bounded in size, matched as data, never
evaluated. The sanitized environment answers a lookup of z's field with the record's value
without z (docs/replay.md, "The sanitized stream"); every other observation is the same text. During a
replay (`shadow=True`) a consequential call is not delivered: it goes to the shadow outbox, and
a call id already delivered is never delivered again, so replaying a session sends nothing twice.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kbench.agent.tools import normalize_field, registered_tools, split_args
from kbench.corpus import Corpus
from kbench.records import FIELD_PHRASES, FIELDS

#: Who `send_message` reaches (the plans pick recipients from these).
RECIPIENTS = ("ops", "hr", "front-desk", "audit")

#: The session tools beside the corpus lookup, and what each takes.
READ_ONLY_TOOLS = ("lookup_record",)
MEMORY_TOOL, CONSEQUENTIAL_TOOL = "remember", "send_message"
SESSION_TOOLS = (*READ_ONLY_TOOLS, MEMORY_TOOL, CONSEQUENTIAL_TOOL)
#: The longest argument the environment reads (a model's argument is untrusted text).
MAX_ARGUMENT_CHARS = 400
#: Each session tool's parameters, in the order the prompt writes them (`tool[a, b]`): K-Bench's
#: three tools (as the agent base learned them), then the memory and the consequential tool.
TOOL_PARAMS = {"search_wiki": ("query",), "lookup_record": ("name", "field"), "verify_attribute": ("name", "field", "value"),
               MEMORY_TOOL: ("note",), CONSEQUENTIAL_TOOL: ("recipient", "text")}
#: What a sanitized lookup of z's field says instead of the value.
WITHHELD = "not on record"


@dataclass(frozen=True)
class Delivery:
    """One consequential call that left the session (or, in a replay, would have)."""

    call_id: str
    recipient: str
    text: str


class SessionEnvironment:
    """The records, notes and outbox of one session. `withheld`: the (entity id, field) whose
    value the sanitized environment does not give out (None: the contaminated environment)."""

    def __init__(self, corpus: Corpus, *, withheld: tuple[str, str] | None = None,
                 source: tuple[str, str] | None = None) -> None:
        self.corpus = corpus
        self.withheld = withheld
        #: The (entity id, field) of z's source: a lookup of it is the observation that brings z in.
        self.source = source
        #: Whether the last call's observation was z's source (the runtime labels it with s).
        self.revealed_source = False
        #: The agent's memory notes (session state: a snapshot holds them).
        self.notes: list[str] = []
        #: Consequential calls delivered, in order: the outside world, which no restore undoes.
        self.outbox: list[Delivery] = []
        #: Consequential calls withheld during a replay, in order.
        self.shadow: list[Delivery] = []
        self._snapshots: dict[str, tuple[str, ...]] = {}
        self._ids = itertools.count()
        self._by_name = {e.name.lower(): e for e in corpus.entities.values()}

    # -- snapshots ---------------------------------------------------------------------------
    def snapshot(self) -> str:
        """An id for the session state (the notes) as it is now."""
        key = f"env-{next(self._ids)}"
        self._snapshots[key] = tuple(self.notes)
        return key

    def restore(self, key: str) -> None:
        """Back to a snapshot's notes; delivered messages stay delivered (they cannot be unsent)."""
        if key not in self._snapshots:
            raise KeyError(f"no environment snapshot {key}")
        self.notes = list(self._snapshots[key])

    def fork(self, *, withheld: tuple[str, str] | None, snapshot: str | None = None) -> SessionEnvironment:
        """An environment for one operator's branch: the notes now (or at `snapshot`), the messages
        already delivered, and `withheld` (the sanitized world after the revocation)."""
        other = SessionEnvironment(self.corpus, withheld=withheld, source=self.source)
        other.notes = list(self._snapshots[snapshot]) if snapshot is not None else list(self.notes)
        other.outbox = list(self.outbox)
        return other

    # -- tools -------------------------------------------------------------------------------
    def tool_lines(self) -> list[str]:
        """How the system prompt lists the tools: K-Bench's, worded as its agent prompt words them."""
        return [
            *(f"- {t.signature}: {t.description}" for t in registered_tools()),
            "- remember[note]: save a note; your notes are shown to you at the start of every later turn.",
            f"- send_message[recipient, text]: send a message to a colleague ({', '.join(RECIPIENTS)}).",
        ]

    def parse(self, tool: str, text: str) -> dict[str, str] | None:
        """A call's arguments from the model's text (split as K-Bench's tools split them); None
        for a tool this environment does not have."""
        names = TOOL_PARAMS.get(tool)
        return None if names is None else dict(zip(names, split_args(text, len(names))))

    def consequential(self, tool: str) -> bool:
        """Whether a call of `tool` has an effect outside the session (a checkpoint precedes it)."""
        return tool == CONSEQUENTIAL_TOOL

    def call(self, tool: str, args: Mapping[str, str], *, call_id: str, shadow: bool = False) -> str:
        """Run one call; every failure is an observation the agent reads, never an exception."""
        values = {k: str(v)[:MAX_ARGUMENT_CHARS] for k, v in args.items()}
        self.revealed_source = False
        if tool == "lookup_record":
            return self._lookup(values.get("name", ""), values.get("field", ""))
        if tool == "verify_attribute":
            return self._verify(values.get("name", ""), values.get("field", ""), values.get("value", ""))
        if tool == "search_wiki":
            return self._search(values.get("query", ""))
        if tool == MEMORY_TOOL:
            note = values.get("note", "").strip()
            if not note:
                return "Error: remember takes a note."
            self.notes.append(note)
            return "Noted."
        if tool == CONSEQUENTIAL_TOOL:
            recipient, text = values.get("recipient", "").strip(), values.get("text", "").strip()
            if not recipient or not text:
                return "Error: send_message takes a recipient and a text."
            delivery = Delivery(call_id, recipient, text)
            if shadow:
                self.shadow.append(delivery)
            elif call_id not in {d.call_id for d in self.outbox}:  # a call id is delivered once
                self.outbox.append(delivery)
            return f"Message sent to {recipient}."
        return f"Error: unknown tool '{tool}'. Tools: {', '.join(SESSION_TOOLS)}."

    def _search(self, query: str) -> str:
        """The biographies of the people the query names (the sessions have no vector index)."""
        text = " ".join(query.lower().split())
        found = [e for key, e in sorted(self._by_name.items()) if key in text][:3]
        if not found:
            return "No results found."
        lines = []
        for i, entity in enumerate(found, start=1):
            bio = entity.bio
            for field_name in FIELDS:
                if self.withheld == (entity.id, field_name):
                    bio = bio.replace(entity.value(field_name), WITHHELD)
                elif self.source == (entity.id, field_name) and entity.value(field_name) in bio:
                    self.revealed_source = True
            lines.append(f"[{i}] {bio}")
        return "\n".join(lines)

    def _record(self, name: str, field_text: str) -> tuple[Any, str] | str:
        """The named person and the normalized field, or the observation saying why not."""
        field_name = normalize_field(field_text)
        if field_name is None:
            return f"Error: unknown field '{field_text}'. Fields: {', '.join(FIELDS)}."
        entity = self._by_name.get(" ".join(name.split()).lower())
        if entity is None:
            return f"No record found for '{name}'."
        return entity, field_name

    def _verify(self, name: str, field_text: str, value: str) -> str:
        found = self._record(name, field_text)
        if isinstance(found, str):
            return found
        entity, field_name = found
        phrase = FIELD_PHRASES[field_name]
        if self.withheld != (entity.id, field_name) and " ".join(value.lower().split()) == \
                " ".join(entity.value(field_name).lower().split()):
            return f"Yes: {entity.name}'s {phrase} is {value}."
        return f"No: that is not {entity.name}'s {phrase}."

    def _lookup(self, name: str, field_text: str) -> str:
        found = self._record(name, field_text)
        if isinstance(found, str):
            return found
        entity, field_name = found
        value = WITHHELD if self.withheld == (entity.id, field_name) else entity.value(field_name)
        self.revealed_source = self.source == (entity.id, field_name) and value != WITHHELD
        return f"{entity.name}'s {FIELD_PHRASES[field_name]}: {value}"
