"""Parse one ReAct step from model text, tolerating in actions what small models emit.

Accepted, case-insensitively, with optional markdown bold around labels:
  Thought: ...             (before an action or answer the label may be missing)
  Action: tool[args]       also tool(args), `tool: args`, and `Action: tool` + `Action Input: args`
The final-answer marker depends on the answer rule (`agent.answer_rule`, docs/agent.md):
  spec      `Final Answer:` exactly as the protocol writes it, at a line start (spaces or tabs
            before it allowed): the protocol line the health check looks for (docs/definitions.md, "Cell metrics")
  lenient   also any case, markdown bold, a `-` instead of the colon, and `Answer:` alone
Whatever follows a hallucinated "Observation:" is dropped: the harness writes observations.
When both an action and a final answer appear, the earlier one wins. The answer keeps
everything after its marker, so a nested protocol payload stays visible to the health check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kbench.names import LENIENT_ANSWER_RULE, SPEC_ANSWER_RULE
from kbench.records import Action

_LABEL = r"^[ \t]*[*_#]*\s*{}\s*[*_]*\s*[:\-–][*_]*[ \t]*"
_OBSERVATION = re.compile(_LABEL.format("observation"), re.IGNORECASE | re.MULTILINE)
#: The final-answer marker of each answer rule.
_FINAL_BY_RULE: dict[str, re.Pattern[str]] = {
    SPEC_ANSWER_RULE: re.compile(r"^[ \t]*Final Answer:[ \t]*", re.MULTILINE),
    LENIENT_ANSWER_RULE: re.compile(_LABEL.format(r"(?:final\s+answer|answer)"), re.IGNORECASE | re.MULTILINE),
}
_ACTION = re.compile(_LABEL.format(r"action(?:\s*\d+)?"), re.IGNORECASE | re.MULTILINE)
_ACTION_INPUT = re.compile(_LABEL.format(r"action\s+input"), re.IGNORECASE | re.MULTILINE)
_THOUGHT = re.compile(_LABEL.format(r"thought(?:\s*\d+)?"), re.IGNORECASE | re.MULTILINE)
_CALL = re.compile(
    r"^\s*`*(?P<tool>[A-Za-z_][\w.]*)`*\s*(?:\[(?P<sq>.*)\]|\((?P<par>.*)\)|:\s*(?P<colon>.+))\s*`*\s*$",
    re.DOTALL,
)


class UnknownAnswerRule(ValueError):
    """An answer rule that is not one of `kbench.names.ANSWER_RULES`."""


@dataclass(frozen=True)
class ParsedStep:
    thought: str | None
    action: Action | None
    answer: str | None

    @property
    def is_valid(self) -> bool:
        return self.action is not None or self.answer is not None


def _clean(text: str) -> str | None:
    text = text.strip()
    return text or None


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
        return text[1:-1].strip()
    return text


def _thought(prefix: str) -> str | None:
    match = _THOUGHT.search(prefix)
    return _clean(prefix[match.end():] if match else prefix)


def _parse_call(line: str, rest: str) -> Action | None:
    match = _CALL.match(line)
    if match:
        args = next(g for g in (match["sq"], match["par"], match["colon"]) if g is not None)
        return Action(tool=match["tool"], args=_unquote(args))
    tool = line.strip().strip("`*").strip()
    inputs = _ACTION_INPUT.search(rest)
    if re.fullmatch(r"[A-Za-z_]\w*", tool) and inputs:
        args = rest[inputs.end():].split("\n", 1)[0]
        return Action(tool=tool, args=_unquote(args.strip().strip("[]()")))
    return None


def parse_step(text: str, rule: str = SPEC_ANSWER_RULE) -> ParsedStep:
    """One step's thought, action and answer; the answer marker is the one `rule` accepts."""
    if rule not in _FINAL_BY_RULE:
        raise UnknownAnswerRule(f"unknown answer rule {rule!r}; expected one of {sorted(_FINAL_BY_RULE)}")
    observation = _OBSERVATION.search(text)
    if observation:
        text = text[: observation.start()]
    final = _FINAL_BY_RULE[rule].search(text)
    action_match = _ACTION.search(text)
    if action_match and (final is None or action_match.start() < final.start()):
        body = text[action_match.end():]
        line, _, rest = body.partition("\n")
        action = _parse_call(line, rest)
        if action is not None:
            return ParsedStep(_thought(text[: action_match.start()]), action, None)
    if final is not None:
        return ParsedStep(_thought(text[: final.start()]), None, text[final.end():].strip())
    # Unlabelled text that is neither an action nor an answer is the reply the user gets, not a
    # thought (the Z_answer channel reads it); only an explicit "Thought:" makes it reasoning.
    labelled = _THOUGHT.search(text)
    return ParsedStep(_clean(text[labelled.end():]) if labelled else None, None, None)
