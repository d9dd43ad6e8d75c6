"""B6, string redaction: every occurrence of z and of its §7 surface variants in the state's
text (transcript, notes, store, summary) is replaced, then the prompt is prefilled again."""

import re
from dataclasses import replace

from kbench.observer.matcher import FIELD_AWARE_RULE, scoring_rule
from kbench.replay.operators import Branch, Operator, OperatorContext, register_operator
from kbench.replay.runtime import Item

REDACTED = "[redacted]"


@register_operator("B6", "string redaction")
class StringRedaction(Operator):
    def apply(self, context: OperatorContext) -> Branch:
        plan = context.plan
        forms = {plan.target, *scoring_rule(FIELD_AWARE_RULE).variants(plan.target_field, plan.target)}
        pattern = re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True) if f.strip()),
                             re.IGNORECASE)

        def redact(item: Item) -> Item:
            return replace(item, text=pattern.sub(REDACTED, item.text))

        state = context.contaminated.fork()
        state.transcript = [redact(i) for i in state.transcript]
        state.stored = [redact(i) for i in state.stored]
        state.env.notes = [pattern.sub(REDACTED, n) for n in state.env.notes]
        state.summary = None if state.summary is None else redact(state.summary)
        context.rebuild(state)
        return Branch(state)
