"""B1, memory-delete: the memory notes that hold z are deleted from the store and from every
memory block the prompt shows (a block renders the store's notes), and the prompt is prefilled
again; the model then no longer reads them. Everything else (the transcript, the summary) stays."""

from dataclasses import replace

from kbench.observer.matcher import match
from kbench.replay.operators import Branch, Operator, OperatorContext, register_operator
from kbench.replay.runtime import Item, memory_block


@register_operator("B1", "memory-delete")
class MemoryDelete(Operator):
    def apply(self, context: OperatorContext) -> Branch:
        state = context.contaminated.fork()
        plan = context.plan

        def holds(text: str) -> bool:
            return match(plan.target_field, plan.target, text).leaked

        deleted = {note.id for note in state.stored if holds(note.text)}
        state.stored = [note for note in state.stored if note.id not in deleted]
        state.env.notes = [note for note in state.env.notes if not holds(note)]
        artifacts = state.graph.artifacts
        transcript = []
        for item in state.transcript:
            if item.role == "memory" and deleted & set(item.notes):  # the block rendered again without them
                kept = [Item(n, "note", artifacts[n].text) for n in item.notes if n not in deleted]
                block = memory_block(item.id.removesuffix("/memory"), kept)
                if block is None:
                    continue
                item = replace(block, id=item.id)
            transcript.append(item)
        state.transcript = transcript
        if deleted:  # the prompt changed: the model reads it without the notes from the first change on
            context.rebuild(state)
        return Branch(state)
