"""The canonical question (docs/definitions.md, "Corpus and splits"), the rung every other form is read against."""

from kbench.forms import CANONICAL, QueryForm, register_form
from kbench.records import Entity, Query


@register_form(CANONICAL, "What is {name}'s {field}?")
class Canonical(QueryForm):
    def question(self, query: Query, entity: Entity) -> str:
        return query.question
