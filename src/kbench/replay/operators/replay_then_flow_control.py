"""B9, selective replay then information-flow control: B7's replay, run again here (its own
restore and replayed turns, measured as B9's cost), then B8's sink policy on the post-revocation
turns, its labels computed on the replayed state; what the policy blocks is in `blocked_calls`."""

from kbench.replay.operators import Branch, Operator, OperatorContext, register_operator
from kbench.replay.operators.flow_control import flow_policy
from kbench.replay.operators.selective_replay import SelectiveReplay


@register_operator("B9", "selective replay, then flow control")
class ReplayThenFlowControl(Operator):
    def apply(self, context: OperatorContext) -> Branch:
        state = SelectiveReplay().apply(context).state
        labelled = frozenset(state.graph.taint_closure(context.source))
        plan = context.plan
        return Branch(state, policy=flow_policy(labelled, plan.target, plan.target_field))
