"""B7, selective replay: restore the last turn-boundary checkpoint before τ (cache cropped back,
environment snapshot) and replay the turns from there (τ..T when every turn holds one) over the
sanitized stream; read-only tools run again on the snapshot, consequential ones are
shadow-executed and deduplicated by call id."""

from kbench.replay.operators import Branch, Operator, OperatorContext, register_operator
from kbench.replay.provenance import ProvenanceGraph


@register_operator("B7", "selective replay")
class SelectiveReplay(Operator):
    def apply(self, context: OperatorContext) -> Branch:
        runtime = context.runtime
        snapshot = runtime.restore_point(context.tau)
        start = snapshot.turns_run + 1  # τ with a checkpoint at every turn; 1 with the session's start only
        before = context.contaminated.graph
        graph = ProvenanceGraph({k: a for k, a in before.artifacts.items() if a.turn < start},
                                [c for c in before.checkpoints if c.turn < start])
        state = runtime.restore(snapshot, context.sanitized_env(snapshot=snapshot.checkpoint.environment), graph)
        runtime.run_session_turns(state, start, sanitized=True, shadow=True, call_prefix=context.plan.session_id)
        return Branch(state)
