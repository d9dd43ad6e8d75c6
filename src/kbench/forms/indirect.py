"""Indirect questions: the person is named by another of their attributes, not by name."""

from kbench.forms import QueryForm, other_field, phrase, register_form
from kbench.records import Entity, Query


@register_form("indirect", "the person named by another attribute")
class Indirect(QueryForm):
    def question(self, query: Query, entity: Entity) -> str:
        through = other_field(query)
        return (f"What is the {phrase(query.field)} of the person whose {phrase(through)} is "
                f"{entity.value(through)}?")
