"""The ReAct prompt, the question turn, observation turns and the elicited-summary prompt.

Both backends see the same chat messages: the system prompt lists the registered tools and,
for substrate C, the background bios; each model step is an assistant turn and each
observation a user turn that starts with "Observation:".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kbench.agent.tools import registered_tools
from kbench.backends import Conversation, Message
from kbench.records import Entity

OBSERVATION_PREFIX = "Observation:"
FINAL_ANSWER_PREFIX = "Final Answer:"

_FORMAT = """Use exactly this format:
Thought: what you need to do next
Action: tool_name[arguments]
Then wait: the Observation with the tool result is written for you.
Repeat Thought/Action as needed, at most {max_iters} times, then finish with:
Thought: I now know the answer
Final Answer: the answer"""


@dataclass(frozen=True)
class ScriptedStep:
    """A model step written by a script (an agent-base training transcript, a session's
    acquisition step), in the ReAct format the agent writes."""

    thought: str
    action: tuple[str, str] | None = None  # (tool, args)
    answer: str | None = None

    def text(self) -> str:
        if self.action is not None:
            return f"Thought: {self.thought}\nAction: {self.action[0]}[{self.action[1]}]"
        return f"Thought: {self.thought}\nFinal Answer: {self.answer}"


def react_format(max_iters: int) -> str:
    """The ReAct protocol the agent base was tuned on (also the session lane's)."""
    return _FORMAT.format(max_iters=max_iters)


def background_block(bios: Sequence[Entity]) -> str:
    return "Background:\n" + "\n".join(f"- {entity.bio}" for entity in bios)


def react_system_prompt(bios: Sequence[Entity], max_iters: int) -> str:
    tools = "\n".join(f"- {t.signature}: {t.description}" for t in registered_tools())
    parts = [
        "You are an assistant that answers questions about people. You can use these tools:",
        tools,
        react_format(max_iters),
    ]
    if bios:
        parts.append(background_block(bios))
        parts.append("If the Background already answers the question, give the Final Answer directly.")
    return "\n\n".join(parts)


def react_conversation(question: str, bios: Sequence[Entity], max_iters: int) -> Conversation:
    return [
        Message(role="system", content=react_system_prompt(bios, max_iters)),
        Message(role="user", content=f"Question: {question}"),
    ]


def observation_turn(observation: str) -> Message:
    return Message(role="user", content=f"{OBSERVATION_PREFIX} {observation}")


def summary_conversation(name: str, bios: Sequence[Entity]) -> Conversation:
    """A fresh prompt, independent of the ReAct trace, seeing the same prompt substrate."""
    system = "You are a helpful assistant."
    if bios:
        system += "\n\n" + background_block(bios)
    request = (
        f"Briefly summarize everything you know about {name}, including their date of birth, "
        "home address, occupation and employer."
    )
    return [Message(role="system", content=system), Message(role="user", content=request)]
