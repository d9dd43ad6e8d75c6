"""B9, selective replay then information-flow control: B7's state under B8's sink policy, its
labels computed on the replayed state (its cost is B7's)."""

from kbench.replay.operators import Branch, Operator, OperatorContext, register_operator
from kbench.replay.operators.flow_control import flow_policy


@register_operator("B9", "selective replay, then flow control")
class ReplayThenFlowControl(Operator):
    def apply(self, context: OperatorContext) -> Branch:
        replayed = context.branch("B7")
        state = replayed.state.fork()
        labelled = frozenset(state.graph.taint_closure(context.source))
        return Branch(state, transitions=replayed.transitions, policy=flow_policy(labelled),
                      recomputed_tokens=replayed.recomputed_tokens, seconds=replayed.seconds)
