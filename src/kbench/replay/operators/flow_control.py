"""B8, information-flow control: the taint closure is labelled and every sink (tool argument,
answer, memory write) computed from a prompt that holds a labelled artifact is blocked."""

from kbench.replay.operators import Branch, Operator, OperatorContext, register_operator
from kbench.replay.runtime import SessionState, SinkPolicy


def flow_policy(labelled: frozenset[str]) -> SinkPolicy:
    """Block a sink when the prompt it is computed from holds a labelled artifact."""
    def blocked(state: SessionState) -> bool:
        return any(artifact in labelled for artifact in state.inventory())
    return blocked


@register_operator("B8", "information-flow control")
class InformationFlowControl(Operator):
    def apply(self, context: OperatorContext) -> Branch:
        return Branch(context.contaminated.fork(), policy=flow_policy(context.closure))
