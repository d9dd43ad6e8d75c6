"""B5, full reset: the whole session rerun from the start over the sanitized stream (the
counterfactual every operator is compared with); consequential calls are shadow-executed."""

from kbench.replay.operators import Branch, Operator, OperatorContext, register_operator


@register_operator("B5", "full reset")
class FullReset(Operator):
    def apply(self, context: OperatorContext) -> Branch:
        runtime = context.runtime
        state = runtime.fresh_state(context.sanitized_env(fresh=True))
        runtime.run_session_turns(state, 1, sanitized=True, shadow=True, call_prefix=context.plan.session_id)
        return Branch(state)
