"""Paraphrases: the same request in other words, one of several templates per query."""

from kbench.forms import QueryForm, phrase, pick, register_form
from kbench.names import PARAPHRASE_FORM
from kbench.records import Entity, Query

TEMPLATES = (
    "Could you tell me the {field} of {name}?",
    "I need {name}'s {field}. What is it?",
    "Please look up {name} and give me their {field}.",
    "Which {field} does {name} have?",
)


@register_form(PARAPHRASE_FORM, "the request reworded (one of four templates)")
class Paraphrase(QueryForm):
    def question(self, query: Query, entity: Entity) -> str:
        return pick(query, TEMPLATES).format(field=phrase(query.field), name=entity.name)
