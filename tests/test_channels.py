"""docs/definitions.md §4: channel texts, the dropped-channel rules and the bare-reply exception."""

from _traces import trace

from kbench.observer.channels import ATTACKER_BUDGETS, CHANNELS, channel_texts


def test_each_channel_reads_its_own_part_of_the_trace():
    record = trace(
        thoughts=["first thought", None, "third thought"],
        tool_args=["Norma Fisher", "Norma Fisher, occupation"],
        observations=["obs one", "obs two"],
        doc_ids=["doc-1", "doc-2"],
        answer="Lawyer",
        summary="A summary.",
    )
    assert channel_texts(record) == {
        "Z_CoT": "first thought\nthird thought",
        "Z_tool": "Norma Fisher\nNorma Fisher, occupation",
        "Z_tool_wide": "Norma Fisher\nNorma Fisher, occupation\nobs one\nobs two",
        "Z_RAG": "doc-1\ndoc-2",
        "Z_answer": "Lawyer",
        "Z_summary": "A summary.",
    }


def test_tool_channel_holds_argument_values_not_tool_names():
    texts = channel_texts(trace(tool_args=["Norma"]))
    assert "search_wiki" not in texts["Z_tool"]
    assert "search_wiki" not in texts["Z_tool_wide"]


def test_empty_channels_are_empty_text_not_dropped():
    texts = channel_texts(trace())
    assert texts["Z_CoT"] == texts["Z_tool"] == texts["Z_tool_wide"] == texts["Z_RAG"] == ""


def test_final_answer_without_answer_text_reads_empty_answer():
    assert channel_texts(trace(answer=None))["Z_answer"] == ""


def test_answer_dropped_when_trajectory_did_not_end_in_final_answer():
    for halted in ("parse_error", "max_iters", "tool_fallback"):
        record = trace(halted_reason=halted, thoughts=["thinking"], answer="Lawyer", raw_reply="junk")
        assert channel_texts(record)["Z_answer"] is None, halted


def test_answer_dropped_after_a_tool_call_even_without_thoughts():
    record = trace(halted_reason="max_iters", tool_args=["Norma"], answer=None, raw_reply="Action: x")
    assert channel_texts(record)["Z_answer"] is None


def test_bare_reply_exception_reads_raw_reply_as_the_answer():
    record = trace(halted_reason="parse_error", answer=None, raw_reply="A: She is a Lawyer.")
    assert channel_texts(record)["Z_answer"] == "A: She is a Lawyer."


def test_bare_reply_exception_ignores_blank_thoughts_and_needs_a_nonblank_reply():
    blank_thought = trace(halted_reason="parse_error", thoughts=["  "], answer=None, raw_reply="Lawyer")
    assert channel_texts(blank_thought)["Z_answer"] == "Lawyer"
    blank_reply = trace(halted_reason="parse_error", answer=None, raw_reply=" \n ")
    assert channel_texts(blank_reply)["Z_answer"] is None


def test_summary_dropped_when_summary_error_is_set():
    assert channel_texts(trace(summary="", summary_error="timeout"))["Z_summary"] is None
    assert channel_texts(trace(summary="kept text", summary_error="boom"))["Z_summary"] is None
    assert channel_texts(trace(summary=None))["Z_summary"] == ""


def test_attacker_budgets_are_nested_and_a5_is_every_channel():
    budgets = list(ATTACKER_BUDGETS.values())
    assert [len(b) for b in budgets] == [1, 2, 3, 5, 6]
    for smaller, larger in zip(budgets, budgets[1:]):
        assert set(smaller) < set(larger)
    assert set(ATTACKER_BUDGETS["A5"]) == set(CHANNELS)
    assert set(ATTACKER_BUDGETS["A4"]) - set(ATTACKER_BUDGETS["A3"]) == {"Z_tool", "Z_tool_wide"}
