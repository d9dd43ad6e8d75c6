"""B8, information-flow control: the artifacts of the taint closure are labelled, and a
consequential sink (a tool call's arguments, a memory write) whose inputs include a labelled
artifact is blocked, call by call: the prompt it is computed from holds a labelled artifact and
its arguments carry what that artifact labels (z, by the matcher). Free text (answers, probe
replies) is not a sink: it flows (docs/replay.md, "Sessions and operators")."""

from typing import Any

from kbench.observer.matcher import match
from kbench.replay.operators import Branch, Operator, OperatorContext, register_operator
from kbench.replay.records import iter_leaves
from kbench.replay.runtime import SessionState, SinkPolicy


def flow_policy(labelled: frozenset[str], target: str, target_field: str | None) -> SinkPolicy:
    """Block a call when its prompt holds a labelled artifact and an argument carries z."""
    def blocked(state: SessionState, tool: str, args: dict[str, Any]) -> bool:
        if not any(artifact in labelled for artifact in state.inventory()):
            return False
        return any(match(target_field, target, leaf).leaked for leaf in iter_leaves(args))
    return blocked


@register_operator("B8", "information-flow control")
class InformationFlowControl(Operator):
    def apply(self, context: OperatorContext) -> Branch:
        plan = context.plan
        return Branch(context.contaminated.fork(), policy=flow_policy(context.closure, plan.target, plan.target_field))
