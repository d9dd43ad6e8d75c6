"""B1, memory-delete: the memory records that hold z are deleted from the store; nothing else
changes (the live prompt keeps what it already rendered, as a deployed agent's context does)."""

from kbench.observer.matcher import match
from kbench.replay.operators import Branch, Operator, OperatorContext, register_operator


@register_operator("B1", "memory-delete")
class MemoryDelete(Operator):
    def apply(self, context: OperatorContext) -> Branch:
        state = context.contaminated.fork()
        plan = context.plan

        def holds(text: str) -> bool:
            return match(plan.target_field, plan.target, text).leaked

        state.stored = [note for note in state.stored if not holds(note.text)]
        state.env.notes = [note for note in state.env.notes if not holds(note)]
        return Branch(state)
