"""B3, source-redaction: z's source (the observation or the user's message that brought it in)
is redacted as the sanitized stream has it and the prompt rebuilt; derived artifacts stay."""

from dataclasses import replace

from kbench.replay.environment import WITHHELD
from kbench.replay.operators import Branch, Operator, OperatorContext, register_operator


@register_operator("B3", "source-redaction")
class SourceRedaction(Operator):
    def apply(self, context: OperatorContext) -> Branch:
        state = context.contaminated.fork()
        origins = context.origins()
        target = context.plan.target
        state.transcript = [replace(i, text=i.text.replace(target, WITHHELD)) if i.id in origins else i
                            for i in state.transcript]
        context.rebuild(state)
        return Branch(state)
