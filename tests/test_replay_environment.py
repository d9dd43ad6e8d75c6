"""The session environment: lookups as the K-Bench tool words them, z withheld in the
sanitized world, notes restored from a snapshot, and a consequential call delivered once:
a replayed send (shadow) is not sent, and a call id is never delivered twice."""

from __future__ import annotations

from kbench.replay.environment import MAX_ARGUMENT_CHARS, WITHHELD, Delivery, SessionEnvironment

from _agent_fixtures import small_corpus  # noqa: F401  (fixture)


def _person(corpus):
    return corpus.entities[corpus.pools["forget_eval"][0]]


def test_lookups_and_the_sanitized_world(small_corpus):  # noqa: F811
    person = _person(small_corpus)
    world = SessionEnvironment(small_corpus)
    clean = SessionEnvironment(small_corpus, withheld=(person.id, "employer"))
    ask = {"name": person.name.upper(), "field": "Employer"}
    assert world.call("lookup_record", ask, call_id="c1") == f"{person.name}'s employer: {person.employer}"
    assert clean.call("lookup_record", ask, call_id="c1") == f"{person.name}'s employer: {WITHHELD}"
    other = {"name": person.name, "field": "occupation"}  # every other observation is the same text
    assert clean.call("lookup_record", other, call_id="c2") == world.call("lookup_record", other, call_id="c2")
    assert world.call("lookup_record", {"name": "Nobody Here", "field": "employer"}, call_id="c3").startswith(
        "No record found")
    assert world.call("lookup_record", {"name": person.name, "field": "shoe size"}, call_id="c4").startswith(
        "Error: unknown field")
    assert world.call("rm_rf", {}, call_id="c5").startswith("Error: unknown tool 'rm_rf'")


def test_a_replayed_send_is_not_sent_twice(small_corpus):  # noqa: F811
    world = SessionEnvironment(small_corpus)
    start = world.snapshot()
    world.call("remember", {"note": "the manager is Z"}, call_id="t1-0")
    world.call("send_message", {"recipient": "ops", "text": "Z"}, call_id="t2-0")
    assert world.notes == ["the manager is Z"] and world.outbox == [Delivery("t2-0", "ops", "Z")]
    world.restore(start)  # selective replay: back before the turns, then run them again
    assert world.notes == []
    world.call("send_message", {"recipient": "ops", "text": "withheld"}, call_id="t2-0", shadow=True)
    assert world.outbox == [Delivery("t2-0", "ops", "Z")]  # shadow-executed: nothing new leaves
    assert world.shadow == [Delivery("t2-0", "ops", "withheld")]
    world.call("send_message", {"recipient": "ops", "text": "again"}, call_id="t2-0")
    assert len(world.outbox) == 1  # the same call id is delivered once
    world.call("send_message", {"recipient": "hr", "text": "new"}, call_id="t9-0")
    assert [d.call_id for d in world.outbox] == ["t2-0", "t9-0"]


def test_arguments_are_bounded_and_checked(small_corpus):  # noqa: F811
    world = SessionEnvironment(small_corpus)
    world.call("remember", {"note": "x" * 10_000}, call_id="a")
    assert world.notes == ["x" * MAX_ARGUMENT_CHARS]
    assert world.call("remember", {"note": "  "}, call_id="b").startswith("Error")
    assert world.call("send_message", {"recipient": "ops"}, call_id="c").startswith("Error")
    assert world.outbox == []


def test_search_and_verify_withhold_z_in_the_sanitized_world(small_corpus):  # noqa: F811
    person = _person(small_corpus)
    key = (person.id, "employer")
    world = SessionEnvironment(small_corpus, source=key)
    clean = SessionEnvironment(small_corpus, withheld=key, source=key)
    found = world.call("search_wiki", {"query": f"who is {person.name}?"}, call_id="c1")
    assert person.employer in found and world.revealed_source
    hidden = clean.call("search_wiki", {"query": f"who is {person.name}?"}, call_id="c1")
    assert person.employer not in hidden and WITHHELD in hidden and not clean.revealed_source
    assert world.call("search_wiki", {"query": "nobody at all"}, call_id="c2") == "No results found."
    ask = {"name": person.name, "field": "employer", "value": person.employer}
    assert world.call("verify_attribute", ask, call_id="c3").startswith("Yes")
    assert clean.call("verify_attribute", ask, call_id="c3").startswith("No")
    assert [line.split("[")[0] for line in world.tool_lines()] == [
        "- search_wiki", "- lookup_record", "- verify_attribute", "- remember", "- send_message"]
