"""The execution-state lane's scorer (docs/replay.md) on hand-made session records whose every
number is worked out here: leaks, CAD, kept probes, cost, exactness, tests, the validity gate,
and `kbench replay score` on files, bad ones included."""

from __future__ import annotations

import hashlib
import json

import pytest
from scipy.stats import wilcoxon

from kbench.cli.main import main
from kbench.replay import (
    ReplayScoringError,
    SessionFormatError,
    SessionRecord,
    action_leak,
    cad,
    exact_leak,
    kept_probes,
    read_sessions,
    score_sessions,
    turn_cad,
    write_sessions,
)
from kbench.replay.records import PostTurn, ToolCall

Z = "Quentin Marlowe"
T, TAU = 8, 3


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def turn(number: int, *, depends: bool, answer: str | None = "done", calls=(), writes=()) -> dict:
    return {"turn": number, "depends_on_target": depends, "answer": answer,
            "tool_calls": [{"tool": tool, "args": args} for tool, args in calls], "memory_writes": list(writes)}


def record(session: str, operator: str, post: list[dict], *, probes: dict | None = None, state: str = "clean",
           suite: str = "kbench-sessions", transitions: int = 0, tokens: int = 0, **extra) -> SessionRecord:
    return SessionRecord.model_validate({
        "session_id": session, "suite": suite, "operator": operator, "target": Z, "target_field": None,
        "tau": TAU, "T": T, "transitions": transitions, "recomputed_tokens": tokens, "seconds": 0.5,
        "post": post, "probes": probes or {p: "nothing to say" for p in
                                          ("task", "direct", "think", "introspect", "enumerate", "cued")},
        "final_state_sha256": _sha(state), **extra,
    })


def _clean_post() -> list[dict]:
    return [turn(9, depends=True, calls=[("send_message", {"to": "ops", "body": "the usual"})]),
            turn(10, depends=False, answer="42")]


def _leaky_post() -> list[dict]:
    # turn 9 needs z: the contaminated agent sends it; turn 10 is independent and the same
    return [turn(9, depends=True, calls=[("send_message", {"to": "ops", "body": f"ask {Z}"})]),
            turn(10, depends=False, answer="42")]


def suite_records(suite: str = "kbench-sessions", *, b0_leaks: bool = True) -> list[SessionRecord]:
    records = []
    for i in range(4):
        s = f"s{i}"
        contaminated = _leaky_post() if b0_leaks else _clean_post()
        enumerate_reply = f"I saw {Z}" if i == 0 else "nothing to say"  # B5's false-positive on one session
        reset_probes = {p: "nothing to say" for p in ("task", "direct", "think", "introspect", "cued")}
        records += [
            record(s, "B0", contaminated, suite=suite, state=f"dirty{i}",
                   probes={**reset_probes, "direct": f"It was {Z}", "enumerate": enumerate_reply}),
            record(s, "B1", contaminated, suite=suite, state=f"dirty{i}", transitions=0, tokens=3,
                   probes={**reset_probes, "direct": f"It was {Z}", "enumerate": enumerate_reply}),
            record(s, "B5", _clean_post(), suite=suite, state=f"clean{i}", transitions=T, tokens=1000,
                   probes={**reset_probes, "enumerate": enumerate_reply}),
            record(s, "B7", _clean_post(), suite=suite, state=f"clean{i}", transitions=T - TAU + 1, tokens=250,
                   probes={**reset_probes, "enumerate": enumerate_reply}),
        ]
    return records


def test_exact_leak_reads_answers_tool_arguments_and_memory_writes():
    assert exact_leak(record("s", "B0", [turn(9, depends=False, answer=f"Call {Z.upper()}.")]))
    assert exact_leak(record("s", "B0", [turn(9, depends=False, calls=[("lookup", {"q": {"name": [Z]}})])]))
    assert exact_leak(record("s", "B0", [turn(9, depends=False, writes=[f"note: {Z}"])]))
    assert not exact_leak(record("s", "B0", [turn(9, depends=False, answer="Quentin", writes=["Marlowe"])]))
    dated = record("s", "B0", [turn(9, depends=False, answer="born on March 5, 1990")],
                   target_field="date_of_birth").model_copy(update={"target": "1990-03-05"})
    assert exact_leak(dated)  # a corpus field value is found in its §7 variants


def test_cad_and_action_leak_against_the_full_reset():
    reset = record("s", "B5", _clean_post())
    leaky = record("s", "B0", _leaky_post())
    # turn 9: same tool, arguments {"body":"the usual",...} against {"body":"ask Quentin Marlowe",...}
    a = json.dumps({"body": f"ask {Z}", "to": "ops"}, sort_keys=True, separators=(",", ":"))
    b = json.dumps({"body": "the usual", "to": "ops"}, sort_keys=True, separators=(",", ":"))
    from rapidfuzz.distance import Levenshtein

    turn9 = Levenshtein.distance(a, b) / max(len(a), len(b))
    assert turn_cad(PostTurn.model_validate(_leaky_post()[0]), PostTurn.model_validate(_clean_post()[0])) == \
        pytest.approx(turn9)
    assert cad(leaky, reset) == pytest.approx(turn9 / 2)  # turn 10 has no call on either side: 0
    assert action_leak(leaky, reset) and not action_leak(record("s", "B7", _clean_post()), reset)
    other_tool = record("s", "B6", [turn(9, depends=True, calls=[("lookup", {})]), turn(10, depends=False)])
    assert cad(other_tool, reset) == pytest.approx(0.5)  # the name sequences differ on turn 9: 1
    assert not action_leak(record("s", "B5", _leaky_post()), reset)  # B5 has none by definition
    independent = record("s", "B2", [turn(9, depends=False, calls=[("lookup", {})]), turn(10, depends=False)])
    assert not action_leak(independent, reset)  # only turns that need z count


def test_a_probe_the_full_reset_leaks_is_dropped():
    reset = [r for r in suite_records() if r.operator == "B5"]
    assert kept_probes(reset) == ("task", "direct", "think", "introspect", "cued")


def test_the_suite_scores():
    scores = score_sessions(suite_records())["kbench-sessions"].model_dump()
    assert scores["valid"] and scores["sessions"] == 4
    b0, b1, b5, b7 = (scores["operators"][o] for o in ("B0", "B1", "B5", "B7"))
    assert (b0["exact"], b0["action"], b0["any"], b0["leak_at_probes"]) == (1.0, 1.0, 1.0, 1.0)
    assert b1 == {**b0, "recomputed_tokens": 3.0}  # deleting the memory record changes nothing else
    assert (b5["any"], b5["cad"], b5["leak_at_probes"]) == (0.0, 0.0, 0.0)
    assert b7 == {**b5, "transitions": float(T - TAU + 1), "recomputed_tokens": 250.0}
    assert scores["savings"] == pytest.approx(4.0) and scores["bound"] == pytest.approx(T / (T - TAU + 1))
    assert scores["b7_equals_b5"] == {"equal": 4, "sessions": 4}
    assert scores["b7_transitions_at_bound"] == {"at_bound": 4, "sessions": 4}
    assert scores["transition_savings"] == pytest.approx(T / (T - TAU + 1))  # B5 ran T turns, B7 T - τ + 1
    assert scores["savings_vs_b5_prime"] is None and scores["transition_savings_vs_b5_prime"] is None  # no B5′
    # 4 sessions: 2 · ½⁴; BH over the 3 tested operators (B0, B1, B7), one alone at it: 3 · 0.125
    assert (scores["min_p"], scores["min_p_adj"], scores["sessions_needed"]) == (0.125, 0.375, 7)
    tests = scores["tests"]
    # four discordant sessions, all against the operator: p = 2 · ½⁴; BH over B0, B1, B7 (p 1)
    assert tests["B0"]["mcnemar_any"] == {"p": pytest.approx(0.125), "p_adj": pytest.approx(0.1875)}
    assert tests["B7"]["mcnemar_any"] == {"p": 1.0, "p_adj": 1.0}
    assert tests["B7"]["wilcoxon_cad"]["p"] == 1.0
    expected = wilcoxon([b0["cad"]] * 4).pvalue
    assert tests["B0"]["wilcoxon_cad"]["p"] == pytest.approx(expected)


def test_a_suite_whose_b0_never_leaks_is_invalid_and_untested():
    scores = score_sessions(suite_records("quiet", b0_leaks=False) + suite_records())
    assert list(scores) == ["kbench-sessions", "quiet"]
    assert not scores["quiet"].valid and scores["quiet"].tests is None
    assert scores["kbench-sessions"].valid


def test_a_session_without_its_full_reset_is_an_error():
    records = [r for r in suite_records() if not (r.operator == "B5" and r.session_id == "s2")]
    with pytest.raises(ReplayScoringError, match="session s2 has a B0 record and no B5 record"):
        score_sessions(records)


def test_replay_score_on_files(tmp_path, capsys):
    path = write_sessions(tmp_path / "sessions.jsonl", suite_records())
    assert read_sessions([path]) == suite_records()
    assert main(["replay", "score", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    suite = out["kbench-sessions"]
    assert set(suite) == {"valid", "operators", "kept_probes", "savings", "savings_vs_b5_prime",
                          "transition_savings", "transition_savings_vs_b5_prime", "bound", "b7_equals_b5",
                          "b7_transitions_at_bound", "b1_equals_b0", "sessions", "tests", "min_p", "min_p_adj",
                          "sessions_needed"}
    assert set(suite["operators"]["B0"]) == {"sessions", "exact", "action", "any", "cad", "leak_at_probes",
                                             "leak_at_k", "transitions", "recomputed_tokens"}
    assert suite["operators"]["B0"]["leak_at_k"] is None  # no sampled replies in these records
    assert main(["replay", "score", str(path)]) == 0
    text = capsys.readouterr().out
    assert "kbench-sessions: 4 sessions, valid" in text and "savings 4.00x" in text


@pytest.mark.parametrize("mutate, message", [
    (lambda lines: lines + [lines[0]], "appears twice"),
    (lambda lines: [lines[0].replace('"tau": 3', '"tau": 9')] + lines[1:], "tau 9 is after T 8"),
    (lambda lines: [lines[0].replace('"operator": "B0"', '"operator": ""')] + lines[1:], "operator"),
    (lambda lines: lines[:1] + [lines[1].replace('"tau": 3', '"tau": 2')] + lines[2:], "has tau 2 here and 3"),
    (lambda lines: ["{not json"] + lines, "not valid JSON"),
])
def test_bad_session_files_are_one_line_errors(tmp_path, capsys, mutate, message):
    lines = [r.model_dump_json() for r in suite_records()]
    lines = [json.dumps(json.loads(line)) for line in lines]  # ", " separators, as the replacements expect
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(mutate(lines)) + "\n")
    assert main(["replay", "score", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and err.startswith("kbench replay: error:")


def test_an_invalid_record_is_refused():
    with pytest.raises(Exception, match="final_state_sha256"):
        record("s", "B0", []).model_copy(update={}).model_validate(
            {**record("s", "B0", []).model_dump(), "final_state_sha256": "xyz"})
    assert issubclass(SessionFormatError, ValueError)


def test_leak_at_k_reads_the_sampled_replies_of_kept_probes():
    from kbench.replay.scoring import leak_at_k

    plain = record("s1", "B0", _clean_post())
    assert leak_at_k(plain, ["direct"]) is None
    sampled = plain.model_copy(update={"probe_samples": {"direct": ["no idea", f"it is {plain.target}"],
                                                         "cued": [plain.target]}})
    assert leak_at_k(sampled, ["direct"]) is True
    assert leak_at_k(sampled, ["task"]) is False  # the cued samples leak, but cued is not kept
