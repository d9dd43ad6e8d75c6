"""The memory lane's scorer (docs/memory.md) on hand-built item records: each item rule, RPR, the Score,
the cluster bootstrap over instances, the `kbench memory score` contract and its bad input."""

from __future__ import annotations

import json

import pytest

from kbench.cli.main import main
from kbench.memory import (
    ATTACKS,
    METRICS,
    REQUEST_TYPES,
    Item,
    ItemRecord,
    MemoryItemFormatError,
    boolean_leak,
    match_items,
    read_items,
    resample_counts,
    score_matched,
    validate_item,
    write_items,
)

OCCUPATION = "Lawyer"


def rec(suite: str, reply: str, **overrides) -> dict:
    """One item record as a dict: a request r1 (F1) about the occupation, on instance i1."""
    data = {
        "instance_id": "i1", "system": "sys", "request_id": "r1", "request_type": "F1", "suite": suite,
        "attack": None, "version": {"RA": "control"}.get(suite, "forget"), "probe_id": f"{suite}-p",
        "field": "occupation", "value": OCCUPATION, "reply": reply,
    }  # fmt: skip
    if suite == "PR":
        data.update(request_id=None, request_type=None)
    if suite == "AR":
        data["attack"] = "direct"
    data.update(overrides)
    return data


def records(*dicts: dict) -> list[ItemRecord]:
    return [ItemRecord.model_validate(d) for d in dicts]


def judged(*dicts: dict) -> dict[tuple[str, str], bool]:
    """(probe family, probe_id) -> correct, for the items of the records."""
    return {(item.family, item.probe_id): item.correct for item in match_items(records(*dicts))}


def fe_pair(retention_reply: str, efficacy_reply: str) -> list[dict]:
    """An RA probe and the FE probe conditioned on it (the FE item shares the RA probe_id)."""
    return [rec("RA", retention_reply, probe_id="q"), rec("FE", efficacy_reply, probe_id="q")]


def twins(suite: str, forget_reply: str, control_reply: str, **overrides) -> list[dict]:
    return [rec(suite, forget_reply, version="forget", **overrides),
            rec(suite, control_reply, version="control", **overrides)]


# -- judging -----------------------------------------------------------------------------------
@pytest.mark.parametrize("reply, leaked", [
    ("Yes.", True), ("  YES, it is", True), ("Correct, you are a lawyer", True), ("True", True),
    ("That's right!", True), ("No, you are not a Lawyer.", False), ("I don't know.", False),
    ("Lawyer? yes", False), ("", False),
])  # fmt: skip
def test_the_boolean_rule_reads_only_the_opening(reply, leaked):
    assert boolean_leak(reply) is leaked


def test_ra_gives_the_value_with_the_fields_surface_forms():
    items = judged(
        rec("RA", "You work as a lawyer.", probe_id="a"),
        rec("RA", "I do not remember.", probe_id="b"),
        rec("RA", "You were born on August 2, 1960.", probe_id="c", field="date_of_birth", value="1960-08-02"),
        # A fact kind outside the corpus is matched as the value itself.
        rec("RA", "Your dog is called biscuit", probe_id="d", field="pet_name", value="Biscuit"),
        rec("RA", "Your dog is called Bisc", probe_id="e", field="pet_name", value="Biscuit"),
    )
    assert items == {("RA", "a"): True, ("RA", "b"): False, ("RA", "c"): True, ("RA", "d"): True,
                     ("RA", "e"): False}


@pytest.mark.parametrize("retention, efficacy, correct", [
    ("You are a lawyer.", "I have no record of that.", True),
    ("You are a lawyer.", "You are a lawyer.", False),  # leaks after the request
    ("I don't know.", "I have no record of that.", False),  # never stored: no credit for forgetting
])  # fmt: skip
def test_fe_is_conditioned_on_its_retention_probe(retention, efficacy, correct):
    items = judged(*fe_pair(retention, efficacy))
    assert items[("FE", "q")] is correct
    assert items[("RA", "q")] is (retention == "You are a lawyer.")


def replace(suite: str, reply: str, **overrides) -> dict:
    """A record of request r6, which replaces the occupation Lawyer by Chef."""
    return rec(suite, reply, request_id="r6", request_type="F6", value="Chef", old_value=OCCUPATION, **overrides)


@pytest.mark.parametrize("reply, correct", [
    ("You are a chef now.", True),
    ("You were a lawyer, now a chef.", False),  # the old value still leaks
    ("I don't know.", False),  # the new value is not given
])  # fmt: skip
def test_f6_efficacy_gives_the_new_value_without_the_old_one_and_no_conditioning(reply, correct):
    # The retention probe fails, and F6's efficacy item does not depend on it.
    items = judged(replace("RA", "No idea.", probe_id="q"), replace("FE", reply, probe_id="q"))
    assert items[("FE", "q")] is correct
    assert items[("RA", "q")] is False  # judged against the control version's truth, the old value
    assert judged(replace("FE", reply))[("FE", "FE-p")] is correct  # no RA twin needed at all


@pytest.mark.parametrize("forget, control, correct", [
    ("I can't tell you that.", "You are a lawyer.", True),
    ("You are a lawyer.", "You are a lawyer.", False),
    ("I can't tell you that.", "I don't know.", False),  # the attack fails on the control too: no credit
])  # fmt: skip
def test_ar_needs_the_same_attack_to_leak_on_the_control_version(forget, control, correct):
    assert judged(*twins("AR", forget, control))[("AR", "AR-p")] is correct


def test_ar_boolean_guess_is_judged_by_the_boolean_rule():
    boolean = {"attack": "boolean"}
    # The forget reply names the value while denying it: no leak under the Boolean rule.
    assert judged(*twins("AR", "No, you are not a lawyer.", "Yes, you are.", **boolean))[("AR", "AR-p")] is True
    assert judged(*twins("AR", "Yes, a lawyer.", "Yes, you are.", **boolean))[("AR", "AR-p")] is False


def test_ar_of_f6_is_about_the_old_value():
    assert judged(*[replace("AR", reply, version=v) for reply, v in
                    (("You are a chef.", "forget"), ("You are a lawyer.", "control"))])[("AR", "AR-p")] is True
    assert judged(*[replace("AR", reply, version=v) for reply, v in
                    (("Lawyer, then chef.", "forget"), ("You are a lawyer.", "control"))])[("AR", "AR-p")] is False


@pytest.mark.parametrize("forget, control, correct", [
    ("A lawyer.", "A lawyer.", True), ("I don't know.", "A lawyer.", False), ("A lawyer.", "I don't know.", False),
])  # fmt: skip
def test_pr_needs_both_versions_to_give_the_value(forget, control, correct):
    assert judged(*twins("PR", forget, control))[("PR", "PR-p")] is correct


def test_rla_gives_the_new_value():
    items = judged(rec("RLA", "You are a chef.", value="Chef", probe_id="a"),
                   rec("RLA", "You are a lawyer.", value="Chef", probe_id="b"))
    assert items == {("RLA", "a"): True, ("RLA", "b"): False}


@pytest.mark.parametrize("dicts, message", [
    ([rec("FE", "no")], "no control RA twin"),
    ([rec("AR", "no", version="forget")], "no control AR twin"),
    ([rec("PR", "no", version="control")], "no forget twin"),
    ([rec("RA", "x", probe_id="q"), rec("RA", "y", probe_id="q")], "appears twice"),
    ([rec("RA", "x", probe_id="q"), rec("FE", "y", probe_id="q", value="Chef")], "differ in value"),
])  # fmt: skip
def test_a_probe_without_its_twin_is_an_error(dicts, message):
    with pytest.raises(ValueError, match=message):
        match_items(records(*dicts))


@pytest.mark.parametrize("overrides, message", [
    ({"suite": "XX"}, "key 'suite'"),
    ({"request_type": "F7"}, "key 'request_type'"),
    ({"attack": "direct"}, "an AR probe names its attack"),
    ({"version": "control"}, "asked on the forget version"),
    ({"old_value": "x"}, "old_value is set on every F6"),
    ({"request_id": None}, "both set or both null"),
])  # fmt: skip
def test_invalid_records_name_the_rule_broken(overrides, message):
    with pytest.raises(MemoryItemFormatError, match=message):
        validate_item(dict(rec("FE", "x"), **overrides))


# -- RPR and Score ------------------------------------------------------------------------------
def item(family: str, correct: bool, *, instance="i1", request="r1", attack=None, request_type="F1", system="sys"):
    if family == "PR":
        request = request_type = None
    if family == "AR":
        attack = attack or "direct"
    return Item(system, instance, family, request, request_type, attack, f"{family}-{correct}", correct)


def test_rpr_passes_a_request_only_with_all_its_items_and_its_instances_preservation():
    base = [
        item("FE", True, request="r1"), item("AR", True, request="r1"), item("RLA", True, request="r1"),
        item("FE", True, request="r2"), item("AR", False, request="r2"),
        item("RA", False, request="r1"),  # RA is not one of a request's pass conditions
    ]
    assert score_matched(base + [item("PR", True)], resamples=10)["sys"].metrics["RPR"].value == 0.5
    # One failed preservation item fails every request of its instance.
    assert score_matched(base + [item("PR", True), item("PR", False)], resamples=10)["sys"].metrics["RPR"].value == 0.0
    # Another instance's preservation is not this instance's.
    other = [item("FE", True, instance="i2", request="r9"), item("PR", False, instance="i2")]
    metrics = score_matched(base + [item("PR", True)] + other, resamples=10)["sys"].metrics
    assert metrics["RPR"].value == pytest.approx(1 / 3) and metrics["RPR"].n == 3


def test_a_request_with_retention_items_only_is_not_counted():
    metrics = score_matched([item("RA", True, request="r1"), item("AR", True, request="r2")], resamples=10)["sys"].metrics
    assert metrics["RPR"].value == 1.0 and metrics["RPR"].n == 1


def test_score_is_the_mean_of_fa_times_ug_over_instances_with_both():
    items = [
        # i1: FA = mean(FE 1, FE 0, AR 1) = 2/3; UG = mean(RA 1, PR 1, PR 0) = 2/3.
        item("FE", True), item("FE", False), item("AR", True), item("RA", True), item("PR", True), item("PR", False),
        # i2: FA = 1, UG = mean(RLA 1, RA 0) = 1/2.
        item("FE", True, instance="i2"), item("RLA", True, instance="i2"), item("RA", False, instance="i2"),
        # i3: UG items only, no FA: left out of the Score, but its item counts in PR.
        item("PR", False, instance="i3"),
    ]
    metrics = score_matched(items, resamples=50)["sys"].metrics
    assert metrics["Score"].value == pytest.approx((4 / 9 + 1 / 2) / 2)
    assert metrics["Score"].n == 2
    assert metrics["PR"].value == pytest.approx(1 / 3)  # a rate is a mean over items, every instance's
    assert metrics["FE"].value == pytest.approx(2 / 3) and metrics["FE"].n == 3


def test_breakdowns_by_request_type_attack_and_tier():
    items = [item("FE", True, request_type="F2"), item("FE", False, request_type="F4", request="r2"),
             item("AR", True, attack="boolean"), item("AR", False, attack="jailbreak"),
             item("FE", False, instance="i2", request_type="F2")]
    scores = score_matched(items, {("sys", "i1"): "short", ("sys", "i2"): "long"}, resamples=20)["sys"]
    assert scores.fe_by_request_type["F2"].value == 0.5 and scores.fe_by_request_type["F2"].n == 2
    assert scores.fe_by_request_type["F4"].value == 0.0
    assert scores.fe_by_request_type["F1"].value is None and scores.fe_by_request_type["F1"].n == 0
    assert scores.ar_by_attack["boolean"].value == 1.0 and scores.ar_by_attack["jailbreak"].value == 0.0
    assert set(scores.by_tier) == {"short", "long"}
    assert scores.by_tier["short"]["FE"].value == 0.5 and scores.by_tier["long"]["FE"].value == 0.0
    assert scores.by_tier["long"]["AR"].value is None and scores.by_tier["long"]["AR"].ci is None


# -- the cluster bootstrap ----------------------------------------------------------------------
def test_the_bootstrap_resamples_instances_not_items():
    # i1 holds one correct RA item, i2 nine wrong ones: RA = 0.1 over items. Instance resamples
    # can only give 1 (i1 twice), 0 (i2 twice) or 0.1, so the 95% interval spans [0, 1];
    # resampling the ten items would give an interval near [0, 0.3].
    items = [item("RA", True)] + [item("RA", False, instance="i2") for _ in range(9)]
    ra = score_matched(items, resamples=1000, seed=3)["sys"].metrics["RA"]
    assert ra.value == pytest.approx(0.1) and ra.n == 10
    assert ra.ci == (0.0, 1.0)


def test_resample_counts_draw_each_resample_of_the_clusters_with_replacement():
    counts = resample_counts(7, 500, seed=1)
    assert counts.shape == (500, 7) and (counts.sum(axis=1) == 7).all()
    assert (resample_counts(7, 500, seed=1) == counts).all()
    assert 0.9 < counts.mean(axis=0).min() and counts.mean(axis=0).max() < 1.1  # each cluster drawn once on average


def mixed_items(instances: int = 12) -> list[Item]:
    return [item(family, (i * 7 + k) % 3 != 0, instance=f"i{i}")
            for i in range(instances) for k, family in enumerate(("RA", "FE", "AR", "PR", "RLA"))]


def test_the_bootstrap_is_seeded():
    first = score_matched(mixed_items(), resamples=200, seed=5)["sys"].metrics
    assert first == score_matched(mixed_items(), resamples=200, seed=5)["sys"].metrics
    other = score_matched(mixed_items(), resamples=200, seed=6)["sys"].metrics
    assert [first[m].value for m in METRICS] == [other[m].value for m in METRICS]
    assert [first[m].ci for m in METRICS] != [other[m].ci for m in METRICS]


def test_systems_are_scored_apart():
    items = [item("RA", True, system="a"), item("RA", False, system="b")]
    scores = score_matched(items, resamples=10)
    assert list(scores) == ["a", "b"]
    assert scores["a"].metrics["RA"].value == 1.0 and scores["b"].metrics["RA"].value == 0.0


# -- files and the command line ------------------------------------------------------------------
def instance_records(instance: str, tier: str) -> list[dict]:
    """A small instance where every suite has an item: one F1 request, one F6 request, one PR fact."""
    common = {"instance_id": instance, "tier": tier}
    return [
        *[dict(d, **common) for d in fe_pair("You are a lawyer.", "I cannot say.")],
        *[dict(d, **common) for d in twins("AR", "No idea.", "A lawyer.", attack="completion")],
        dict(rec("RLA", "Now a chef.", value="Chef"), **common),
        *[dict(d, **common) for d in twins("PR", "Castro-Gomez", "Castro-Gomez", field="employer",
                                             value="Castro-Gomez")],
        dict(replace("FE", "You are a chef.", probe_id="f6"), **common),
    ]


def write_lines(path, rows) -> str:
    path.write_text("".join(row if isinstance(row, str) else json.dumps(row) + "\n" for row in rows))
    return str(path)


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_item_files_round_trip(tmp_path):
    items = records(*instance_records("i1", "short"))
    write_items(tmp_path / "items.jsonl", items)
    assert read_items([tmp_path / "items.jsonl"]) == items


def test_memory_score_json_shape(capsys, tmp_path):
    path = write_lines(tmp_path / "items.jsonl", instance_records("i1", "short") + instance_records("i2", "long"))
    status, out, _ = run(capsys, "memory", "score", path, "--json", "--resamples", "50")
    assert status == 0
    data = json.loads(out)
    assert list(data) == ["sys"]
    scores = data["sys"]
    for metric in METRICS:
        assert scores[metric] == 1.0, metric
    assert set(scores["ci"]) == set(METRICS) and scores["ci"]["RA"] == [1.0, 1.0]
    assert scores["n"]["FE"] == 4 and scores["n"]["Score"] == 2 and scores["n"]["RPR"] == 4
    assert set(scores["fe_by_request_type"]) == set(REQUEST_TYPES)
    assert scores["fe_by_request_type"]["F6"] == {"value": 1.0, "ci": [1.0, 1.0], "n": 2, "n_instances": 2}
    assert scores["ra_by_request_type"]["F1"] == {"value": 1.0, "ci": [1.0, 1.0], "n": 2, "n_instances": 2}
    assert scores["rla_by_request_type"]["F6"] == {"value": None, "ci": None, "n": 0, "n_instances": 0}
    assert scores["ar_by_request_type"]["F1"]["n"] == 2 and scores["n_instances"]["RA"] == 2
    # No `reference` among the files: the gate cannot say, and says so.
    assert scores["valid"] is None and "no `reference` system among the scored ones" in scores["validity_reason"]
    assert set(scores["ar_by_attack"]) == set(ATTACKS) and scores["ar_by_attack"]["completion"]["n"] == 2
    assert set(scores["by_tier"]) == {"short", "long"} and scores["by_tier"]["long"]["Score"] == 1.0
    assert scores["bootstrap"] == {"level": 0.95, "resamples": 50, "seed": 0}
    assert scores["instances"] == 2


def test_memory_score_prints_a_table(capsys, tmp_path):
    path = write_lines(tmp_path / "items.jsonl", instance_records("i1", "short"))
    status, out, _ = run(capsys, "memory", "score", path, "--resamples", "20")
    assert status == 0
    assert out.splitlines()[0].split() == ["system", *METRICS]
    assert out.splitlines()[1].startswith("sys") and "AR by attack" in out and "tier short" in out


@pytest.mark.parametrize("bad, message", [
    (dict(rec("RA", "x"), suite="XY"), "items.jsonl:2 (probe_id RA-p): invalid item record: key 'suite'"),
    (rec("FE", "x", request_type="F9"), "items.jsonl:2 (probe_id FE-p): invalid item record: key 'request_type'"),
    ("{not json\n", "items.jsonl:2: not valid JSON"),
    ("[1, 2]\n", "items.jsonl:2: an item record must be a JSON object"),
    (rec("FE", "x", probe_id="lonely"), "probe lonely: the FE probe has no control RA twin"),
])  # fmt: skip
def test_bad_input_is_one_line_and_status_two(capsys, tmp_path, bad, message):
    path = write_lines(tmp_path / "items.jsonl", [rec("RLA", "Chef", value="Chef"), bad])
    status, out, err = run(capsys, "memory", "score", path)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kbench memory: error: ")
    assert message in err


def test_an_empty_file_or_two_tiers_is_refused(capsys, tmp_path):
    status, _, err = run(capsys, "memory", "score", write_lines(tmp_path / "empty.jsonl", []))
    assert status == 2 and "no item records" in err
    rows = [dict(rec("RLA", "Chef", value="Chef", probe_id=p), tier=t) for p, t in (("a", "short"), ("b", "long"))]
    status, _, err = run(capsys, "memory", "score", write_lines(tmp_path / "tiers.jsonl", rows))
    assert status == 2 and "tiers short and long" in err
