"""The query-form ladder (`queries.forms`): the same fact asked other ways, one registered file each.

A form rewrites a canonical query ("What is {name}'s {field}?", docs/definitions.md, "Corpus and splits")
about one entity: a
paraphrase, an indirect question that names the person through another attribute, a
declarative completion, or the adaptive attacker, which rewrites a question the agent refused.
The rewritten query keeps the canonical query's entity, field and ground truth; its id is the
canonical id plus `::<form>` and its trace record carries `form`. A new form is one module here
with a class decorated by `register_form`; `kbench list forms` lists them.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import ClassVar

from kbench.observer.taxonomy import REFUSAL, failure_mode
from kbench.records import FIELD_PHRASES, FIELDS, Entity, Query, TraceRecord
from kbench.registry import Registry, import_submodules

#: The form of the benchmark's own questions: not a rewrite (records carry no `form`).
CANONICAL = "canonical"


class FormError(ValueError):
    """An unknown query form."""


class QueryForm(ABC):
    """One way of asking for a field of an entity."""

    #: Its name in params (`queries.forms`), query ids and tables.
    name: ClassVar[str]
    #: What it asks like, in a few words.
    title: ClassVar[str]
    #: Asked only after the canonical question was refused, as a rewrite of it.
    adaptive: ClassVar[bool] = False

    @abstractmethod
    def question(self, query: Query, entity: Entity) -> str:
        """The question in this form."""


_FORMS: Registry[type[QueryForm]] = Registry("query form", FormError)


def register_form(name: str, title: str, *, adaptive: bool = False) -> Callable[[type[QueryForm]], type[QueryForm]]:
    def decorate(cls: type[QueryForm]) -> type[QueryForm]:
        cls.name, cls.title, cls.adaptive = name, title, adaptive
        _FORMS.add(name, cls)
        return cls

    return decorate


def _load() -> None:
    import_submodules(__name__, __path__)


def form_names() -> list[str]:
    _load()
    return _FORMS.names()


def form_class(name: str) -> type[QueryForm]:
    _load()
    return _FORMS.get(name)


def pick(query: Query, options: Sequence[str], salt: str = "") -> str:
    """One of `options`, chosen by the query id (and `salt`): the same on any machine and day."""
    digest = hashlib.sha256(f"{query.query_id}|{salt}".encode()).digest()
    return options[int.from_bytes(digest[:4], "big") % len(options)]


def phrase(field: str) -> str:
    """How a field is named in a question ("home address")."""
    return FIELD_PHRASES[field]


def other_field(query: Query) -> str:
    """A field other than the one asked, chosen by the query id: what an indirect question names the person by."""
    return pick(query, [f for f in FIELDS if f != query.field], "other")


def laddered(queries: Sequence[Query], form_n: int) -> list[Query]:
    """The queries the ladder asks again: the first `form_n` (0: all)."""
    return list(queries[:form_n] if form_n else queries)


def ladder(queries: Sequence[Query], entities: Mapping[str, Entity], forms: Sequence[str], form_n: int) -> list[Query]:
    """The non-adaptive forms of the laddered queries, form by form."""
    chosen = laddered(queries, form_n)
    return [ask(q, entities[q.entity_id], form) for form in forms if not form_class(form).adaptive for q in chosen]


def refused_again(queries: Sequence[Query], records: Iterable[TraceRecord], entities: Mapping[str, Entity],
                  forms: Sequence[str], form_n: int) -> list[Query]:
    """The adaptive forms of the laddered queries whose canonical answer was a refusal."""
    refused = {r.query_id for r in records if r.form is None and failure_mode(r) == REFUSAL}
    chosen = [q for q in laddered(queries, form_n) if q.query_id in refused]
    return [ask(q, entities[q.entity_id], form) for form in forms if form_class(form).adaptive for q in chosen]


def ask(query: Query, entity: Entity, form: str) -> Query:
    """`query` asked in `form` (the canonical query itself for `CANONICAL`)."""
    if form == CANONICAL:
        return query
    question = form_class(form)().question(query, entity)
    return query.model_copy(update={"query_id": f"{query.query_id}::{form}", "question": question, "form": form})


__all__ = ["CANONICAL", "FormError", "QueryForm", "ask", "form_class", "form_names", "ladder", "laddered",
           "other_field", "phrase", "pick", "refused_again", "register_form"]
