"""The lane's session suites by name: the project's own (`kbench-sessions`, `kbench-sessions-memory`)
and AgentDojo's (`agentdojo-banking`, ...). A suite gives its planned sessions, each with a
function that builds the session's contaminated world."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kbench.config import ReplayConfig
from kbench.corpus import Corpus
from kbench.replay.agentdojo import agentdojo_suite_names, environment_for, plan_agentdojo
from kbench.replay.environment import SessionEnvironment
from kbench.replay.sessions import SUITES, SessionPlan, plan_suite


class UnknownSuite(ValueError):
    """A suite name that is not a registered one."""


def suite_names() -> list[str]:
    return [*SUITES, *agentdojo_suite_names()]


def suite_kind(name: str) -> str:
    """How z enters the suite's sessions: `tool` or `memory`."""
    return SUITES.get(name, "tool")


def check_suite(name: str) -> None:
    if name not in suite_names():
        raise UnknownSuite(f"unknown suite {name!r}; registered: {suite_names()}")


def suite_sessions(name: str, corpus: Corpus, config: ReplayConfig) -> list[tuple[SessionPlan, Callable[[], Any]]]:
    """The suite's plans, each with the builder of its contaminated environment."""
    check_suite(name)
    shape = {"sessions": config.sessions, "T": config.T, "tau": config.tau, "indep": config.indep,
             "n_post": config.n_post, "seed": config.seed}
    if name in SUITES:
        return [(plan, lambda plan=plan: SessionEnvironment(corpus, source=(plan.target_entity, plan.target_field)))
                for plan in plan_suite(corpus, kind=SUITES[name], **shape)]
    return [(plan, lambda plan=plan, injections=injections: environment_for(name, injections, plan))
            for plan, injections in plan_agentdojo(name, corpus, **shape)]
