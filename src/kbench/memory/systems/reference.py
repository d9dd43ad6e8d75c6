"""`reference`: the counterfactual every system is measured against (exact forgetting): the
full context of a dialogue rebuilt without the requested facts (`counterfactual_sessions`), as if
the user had never told them; the control version is the dialogue as it was."""

from __future__ import annotations

from kbench.memory.instances import Instance, Session, counterfactual_sessions
from kbench.memory.records import FORGET_VERSION
from kbench.memory.systems import register_memory_system
from kbench.memory.systems.full_context import FullContext


@register_memory_system("reference")
class Reference(FullContext):
    def dialogue(self, instance: Instance, version: str) -> list[Session]:
        return counterfactual_sessions(instance) if version == FORGET_VERSION else instance.control
