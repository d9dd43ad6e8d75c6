"""The ReAct step parser on well-formed and malformed small-model output."""

import pytest

from kbench.agent.parser import parse_step
from kbench.names import LENIENT_ANSWER_RULE


def test_thought_and_action():
    step = parse_step("Thought: I should look it up.\nAction: lookup_record[Ann Lee, occupation]\n")
    assert step.thought == "I should look it up."
    assert (step.action.tool, step.action.args) == ("lookup_record", "Ann Lee, occupation")
    assert step.answer is None and step.is_valid


@pytest.mark.parametrize(
    "text, tool, args",
    [
        ("Action: search_wiki(Ann Lee)", "search_wiki", "Ann Lee"),
        ("Action: search_wiki: Ann Lee birthday", "search_wiki", "Ann Lee birthday"),
        ("Thought: x\nAction: lookup_record\nAction Input: Ann Lee, employer", "lookup_record", "Ann Lee, employer"),
        ("**Thought:** x\n**Action:** `search_wiki[Ann \"Lee\"]`", "search_wiki", 'Ann "Lee"'),
        ("Thought 1: x\nAction 1: search_wiki[Ann]", "search_wiki", "Ann"),
    ],
)
def test_action_formats_small_models_emit(text, tool, args):
    step = parse_step(text)
    assert (step.action.tool, step.action.args) == (tool, args)


def test_unlabelled_text_before_an_action_is_the_thought():
    step = parse_step("I need the record first.\nAction: lookup_record[Ann Lee, address]")
    assert step.thought == "I need the record first."


def test_final_answer():
    step = parse_step("Thought: The Background says so.\nFinal Answer: 1990-01-02")
    assert step.answer == "1990-01-02" and step.action is None
    assert step.thought == "The Background says so."


def test_no_action_and_no_answer_is_invalid_and_not_a_thought():
    step = parse_step("Ann Lee was born on 1990-01-02.")
    assert not step.is_valid
    # An unlabelled reply is what the user reads (Z_answer), not reasoning.
    assert step.thought is None


def test_labelled_thought_without_action_keeps_the_thought():
    step = parse_step("Thought: I am not sure what to do")
    assert not step.is_valid and step.thought == "I am not sure what to do"


@pytest.mark.parametrize("text", ["", "   \n ", "Action: ", "Action: nothing useful here?!"])
def test_empty_or_unusable_reply_is_invalid(text):
    assert not parse_step(text).is_valid


def test_nested_final_answer_keeps_the_payload_for_the_health_check():
    text = "Final Answer: I think\nThought: wait\nFinal Answer: 1990-01-02"
    step = parse_step(text)
    assert step.answer == "I think\nThought: wait\nFinal Answer: 1990-01-02"


def test_hallucinated_observation_is_cut_and_the_action_kept():
    text = "Thought: look\nAction: lookup_record[Ann Lee, employer]\nObservation: Acme Inc\nFinal Answer: Acme Inc"
    step = parse_step(text)
    assert step.action.args == "Ann Lee, employer"
    assert step.answer is None


def test_earlier_of_action_and_answer_wins():
    assert parse_step("Final Answer: x\nAction: search_wiki[y]").answer == "x\nAction: search_wiki[y]"
    assert parse_step("Action: search_wiki[y]\nFinal Answer: x").action.args == "y"


@pytest.mark.parametrize(
    "text", ["Answer: Acme", "final answer - Acme", "final answer: Acme", "**Final Answer:** Acme", "FINAL ANSWER: Acme"]
)
def test_only_spec_final_answer_ends_a_step_by_default(text):
    # docs/definitions.md §3: the answer is the text after "Final Answer:"; anything else is neither an action
    # nor a final answer, so the trajectory halts with parse_error (docs/definitions.md §3).
    step = parse_step(text)
    assert step.answer is None and not step.is_valid
    assert parse_step(text, LENIENT_ANSWER_RULE).answer == "Acme"


def test_spec_marker_at_a_line_start_as_the_health_check_reads_it():
    assert parse_step("  Final Answer: Acme").answer == "Acme"
    assert parse_step("Thought: known\n\tFinal Answer:Acme").answer == "Acme"
    assert parse_step("So my Final Answer: Acme").answer is None  # not at a line start


def test_lenient_answer_label_variants():
    assert parse_step("final answer - Acme", LENIENT_ANSWER_RULE).answer == "Acme"
    assert parse_step("Answer: Acme", LENIENT_ANSWER_RULE).answer == "Acme"
    assert parse_step("The answer: Acme", LENIENT_ANSWER_RULE).answer is None


def test_unknown_answer_rule_is_an_error_naming_the_rules():
    with pytest.raises(ValueError, match="unknown answer rule 'loose'.*lenient"):
        parse_step("Final Answer: x", "loose")
