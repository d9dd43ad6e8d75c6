"""B4, sanitize-no-replay: every artifact of the taint closure leaves the state (transcript,
notes, store, summary) and the prompt is rebuilt without recomputing any of them."""

from kbench.replay.operators import Branch, Operator, OperatorContext, register_operator


@register_operator("B4", "sanitize-no-replay")
class SanitizeNoReplay(Operator):
    def apply(self, context: OperatorContext) -> Branch:
        state = context.contaminated.fork()
        tainted = context.closure
        state.transcript = [i for i in state.transcript if i.id not in tainted]
        state.stored = [i for i in state.stored if i.id not in tainted]
        state.env.notes = [n.text for n in state.stored]
        if state.summary is not None and state.summary.id in tainted:
            state.summary = None
        context.rebuild(state)
        return Branch(state)
