"""`none`: the no-intervention baseline every other method is compared with."""

from kbench.methods.base import ALL_SUBSTRATES, Method, register_method


@register_method("none", substrates=ALL_SUBSTRATES)
class NoIntervention(Method):
    """Uses no hook: the agent runs on the substrate as deployed."""
