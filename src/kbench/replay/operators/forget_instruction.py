"""B2, forget-instruction: an instruction to forget z joins the prompt (prefilled now)."""

from kbench.replay.operators import Branch, Operator, OperatorContext, register_operator
from kbench.replay.provenance import Artifact
from kbench.replay.runtime import Item

INSTRUCTION = ('Instruction from the system: the user has withdrawn "{target}". Forget it: do not use, '
               "repeat or reveal it from now on.")


@register_operator("B2", "forget-instruction")
class ForgetInstruction(Operator):
    def apply(self, context: OperatorContext) -> Branch:
        state = context.contaminated.fork()
        item = Item(f"{context.plan.session_id}/forget-instruction", "user",
                    INSTRUCTION.format(target=context.plan.target))
        state.graph.add(Artifact(item.id, "user", context.plan.T, text=item.text))
        state.transcript.append(item)
        context.rebuild(state)
        return Branch(state)
