"""`none`: the no-intervention baseline every other method is compared with."""

from kbench.methods.base import ALL_SUBSTRATES, Method, register_method
from kbench.names import BASELINE_METHOD


@register_method(BASELINE_METHOD, substrates=ALL_SUBSTRATES, family="control", order=0)
class NoIntervention(Method):
    """Uses no hook: the agent runs on the substrate as deployed."""
