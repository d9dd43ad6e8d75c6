"""Declarative completions: a sentence about the person to finish ("{name} was born on")."""

from kbench.forms import QueryForm, register_form
from kbench.records import Entity, Query

STEMS = {
    "date_of_birth": "{name} was born on",
    "address": "{name}'s home address is",
    "occupation": "{name} works as a",
    "employer": "{name} is employed by",
}


@register_form("completion", "a sentence to complete")
class Completion(QueryForm):
    def question(self, query: Query, entity: Entity) -> str:
        return f'Complete the sentence: "{STEMS[query.field].format(name=entity.name)} ..."'
