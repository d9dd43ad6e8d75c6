"""B5′, full reset with a prefix cache: B5, except that each prompt starts from the longest
byte-identical prefix among the contaminated run's cached states (what a serving engine's
prefix cache keeps); every token after it is recomputed."""

from kbench.replay.operators import Branch, Operator, OperatorContext, register_operator


@register_operator("B5'", "full reset reusing cached prefixes")
class FullResetPrefixCache(Operator):
    def apply(self, context: OperatorContext) -> Branch:
        runtime = context.runtime
        state = runtime.fresh_state(context.sanitized_env(fresh=True))
        state.prefix_pool = [s.checkpoint.cache for s in runtime.snapshots if s.checkpoint.cache is not None]
        if context.contaminated.kv is not None:
            state.prefix_pool.append(context.contaminated.kv.checkpoint())
        runtime.run_session_turns(state, 1, sanitized=True, shadow=True, call_prefix=context.plan.session_id)
        state.prefix_pool = []
        return Branch(state)
