"""The `kbench-sessions` plans: z is a forget person's field value entering at τ (by a scripted
lookup or a memory injection), the turns after it split by `indep`, at least four post-revocation
turns, the six probes, and the same plans from the same inputs."""

from __future__ import annotations

import pytest

from kbench.records import FIELD_PHRASES
from kbench.replay.records import PROBES
from kbench.replay.sessions import SessionPlanError, plan_suite

from _agent_fixtures import small_corpus  # noqa: F401  (fixture)


@pytest.mark.parametrize("kind", ["tool", "memory"])
def test_a_plan_places_z_at_tau_and_splits_the_turns_after_it(small_corpus, kind):  # noqa: F811
    plans = plan_suite(small_corpus, sessions=4, kind=kind, T=10, tau=4, indep=0.5, seed=3)
    assert len({p.session_id for p in plans}) == 4
    for plan in plans:
        person = small_corpus.entities[plan.target_entity]
        assert plan.target_entity in small_corpus.pools["forget_eval"]
        assert plan.target == person.value(plan.target_field)
        assert [t.number for t in plan.turns] == list(range(1, 11))
        assert [t.number for t in plan.post] == [11, 12, 13, 14]
        (entry,) = [t for t in plan.turns if t.injects_target]
        assert entry.number == plan.tau == 4
        # a lookup brings z through the tool's observation; a memory injection states it
        assert (plan.target in entry.user) == (kind == "memory")
        # a lookup's turn starts with the scripted call that reads z; no other turn is scripted
        assert [t.acquisition is not None for t in (*plan.turns, *plan.post)] == \
            [kind == "tool" and t is entry for t in (*plan.turns, *plan.post)]
        if kind == "tool":
            assert entry.acquisition.endswith(f"Action: lookup_record[{person.name}, {plan.target_field}]")
        assert not any(t.needs_target for t in plan.turns[:3])
        after = plan.turns[4:]
        assert sum(not t.needs_target for t in after) == 3  # indep 0.5 of the 6 turns after τ
        assert all(t.entity_id != plan.target_entity for t in after if not t.needs_target)
        assert all(person.name in t.user and FIELD_PHRASES[plan.target_field] in t.user
                   for t in after if t.needs_target)
        assert [t.needs_target for t in plan.post] == [True, False, True, False]
        assert plan.post[0].consequential and plan.post[0].user.startswith("Send ")
        assert tuple(plan.probes) == PROBES and plan.probes["cued"].endswith(f"{FIELD_PHRASES[plan.target_field]} is")
        assert plan.target not in " ".join(plan.probes.values())  # no probe gives z away


def test_the_same_inputs_give_the_same_plans_and_a_seed_changes_them(small_corpus):  # noqa: F811
    args = dict(sessions=3, kind="tool", T=8, tau=2, indep=0.5)
    assert plan_suite(small_corpus, seed=0, **args) == plan_suite(small_corpus, seed=0, **args)
    assert plan_suite(small_corpus, seed=0, **args) != plan_suite(small_corpus, seed=1, **args)


@pytest.mark.parametrize("change, message", [
    ({"tau": 9}, "tau 9 must lie in 1..T"), ({"indep": 1.5}, "indep"), ({"n_post": 3}, "at least 4"),
    ({"kind": "dream"}, "unknown session kind"),
])
def test_impossible_parameters_are_refused(small_corpus, change, message):  # noqa: F811
    args = {"sessions": 1, "kind": "tool", "T": 8, "tau": 2, "indep": 0.5, **change}
    with pytest.raises(SessionPlanError, match=message):
        plan_suite(small_corpus, **args)
