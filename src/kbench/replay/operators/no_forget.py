"""B0, no-forget: the post-revocation turns run on the contaminated state as it is."""

from kbench.replay.operators import Branch, Operator, OperatorContext, register_operator


@register_operator("B0", "no-forget")
class NoForget(Operator):
    def apply(self, context: OperatorContext) -> Branch:
        return Branch(context.contaminated.fork())
