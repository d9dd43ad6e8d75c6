"""The ReAct agent, run in lockstep batches.

Every active trajectory advances one ReAct step per batched `generate` call; a trajectory
that halts leaves the batch and a waiting query takes its place. Each halted trajectory is
handed on as a trace record at once, with its summary from a fresh prompt (computed in full
batches that also cover queries still running: a summary does not depend on the trace).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from kbench.agent.parser import parse_step
from kbench.agent.prompts import OBSERVATION_PREFIX, observation_turn, react_conversation, summary_conversation
from kbench.agent.tools import ToolContext, call_tool
from kbench.backends import Backend, Conversation, Generation, Message
from kbench.config import AgentConfig
from kbench.methods import Method
from kbench.records import Query, Retrieval, Split, Step, TraceRecord
from kbench.substrates import Substrate


@dataclass
class Trajectory:
    query: Query
    split: Split
    conversation: Conversation
    tools: ToolContext
    steps: list[Step] = field(default_factory=list)
    retrieval: list[Retrieval] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    answer: str | None = None
    halted_reason: str | None = None
    tool_errors_in_a_row: int = 0
    #: What the backend keeps between this trajectory's steps (its KV cache), or None.
    session: Any = None
    summary: str | None = None
    summary_error: str | None = None

    @property
    def done(self) -> bool:
        return self.halted_reason is not None


def _join(*parts: str | None) -> str | None:
    kept = [p.strip() for p in parts if p and p.strip()]
    return "\n".join(kept) or None


class ReActAgent:
    def __init__(
        self, backend: Backend, substrate: Substrate, method: Method, config: AgentConfig, *, seed: int
    ) -> None:
        self.backend = backend
        self.substrate = substrate
        self.method = method
        self.config = config
        self.seed = seed

    # -- generation with the method's hooks --------------------------------------------
    def _generate(
        self,
        queries: Sequence[Query],
        conversations: Sequence[Conversation],
        *,
        stop: Sequence[str],
        max_new_tokens: int,
        sessions: Sequence[Any] | None = None,
    ) -> list[Generation]:
        hooks = self.method.hooks
        if "input" in hooks:
            conversations = [self.method.rewrite_input(q, c) for q, c in zip(queries, conversations)]
        forward = self.method.forward_hooks(self.backend, queries) if "forward" in hooks else nullcontext()
        if sessions is not None and "forward" in hooks:  # a hook that must see the whole prompt again
            sessions = [self.backend.session() if self.method.fresh_prompt(q) else s for q, s in zip(queries, sessions)]
        with forward:
            # A hook that treats queries differently must not see one query's prefix reused for another.
            generations = self.backend.generate(
                conversations, stop=stop, max_new_tokens=max_new_tokens, sessions=sessions,
                share_prefixes="forward" not in hooks or self.method.uniform_forward,
            )
        if "output" in hooks:
            generations = [
                Generation(self.method.filter_output(q, g.text), g.reasoning)
                for q, g in zip(queries, generations)
            ]
        return generations

    # -- one trajectory ------------------------------------------------------------------
    def start(self, query: Query, split: Split) -> Trajectory:
        bios = self.substrate.background(query)
        return Trajectory(
            query=query,
            split=split,
            conversation=react_conversation(query.question, bios, self.config.max_iters),
            tools=ToolContext(self.substrate, query, self.config.retrieval_top_k, self.config.max_observation_chars),
            session=self.backend.session(),
        )

    def advance(self, trajectory: Trajectory, generation: Generation) -> None:
        """Apply one model step: run its action and write the observation, or halt."""
        text = generation.text
        trajectory.replies.append(text)
        parsed = parse_step(text, self.config.answer_rule)
        thought = _join(generation.reasoning, parsed.thought)
        if parsed.action is None:
            trajectory.steps.append(Step(thought=thought))
            if parsed.answer is not None:
                trajectory.answer = parsed.answer
                trajectory.halted_reason = "final_answer"
            else:
                trajectory.halted_reason = "parse_error"
            return
        result = call_tool(trajectory.tools, parsed.action.tool, parsed.action.args)
        trajectory.steps.append(Step(
            thought=thought, action=parsed.action, observation=result.observation,
            observation_cut=result.cut or None,
        ))
        if result.retrieval is not None:
            trajectory.retrieval.append(result.retrieval)
        trajectory.conversation = [
            *trajectory.conversation,
            Message(role="assistant", content=text.strip()),
            observation_turn(result.observation),
        ]
        trajectory.tool_errors_in_a_row = trajectory.tool_errors_in_a_row + 1 if result.error else 0
        if trajectory.tool_errors_in_a_row >= self.config.max_consecutive_tool_errors:
            trajectory.halted_reason = "tool_fallback"
        elif len(trajectory.steps) >= self.config.max_iters:
            trajectory.halted_reason = "max_iters"

    # -- batches ---------------------------------------------------------------------------
    def step_batch(self, trajectories: Sequence[Trajectory]) -> None:
        """One ReAct step of every trajectory in one batched call. A step reaches the substrate
        only through the trajectory's tools, so trajectories that other agents (with this
        backend, method and config) started on other substrates can share the batch."""
        generations = self._generate(
            [t.query for t in trajectories],
            [t.conversation for t in trajectories],
            stop=[OBSERVATION_PREFIX],
            max_new_tokens=self.config.max_new_tokens,
            sessions=None if trajectories[0].session is None else [t.session for t in trajectories],
        )
        for trajectory, generation in zip(trajectories, generations):
            self.advance(trajectory, generation)
            if trajectory.done:
                trajectory.session = None  # its cache is not needed any more

    def summarize(self, queries: Sequence[Query]) -> list[tuple[str | None, str | None]]:
        """The elicited summary of each query, as (summary, summary_error): a fresh prompt per
        entity that sees the same substrate and nothing of the ReAct trace (docs/definitions.md, "The trace record")."""
        if not queries:
            return []
        conversations = [
            summary_conversation(self.substrate.resources.corpus.entities[q.entity_id].name, self.substrate.background(q))
            for q in queries
        ]
        try:
            generations = self._generate(
                queries, conversations, stop=[], max_new_tokens=self.config.summary_max_new_tokens
            )
        except Exception as exc:  # recorded as summary_error; the channel is then dropped
            return [(None, f"{type(exc).__name__}: {exc}")] * len(queries)
        return [(generation.text.strip(), None) for generation in generations]

    def record(self, trajectory: Trajectory) -> TraceRecord:
        query = trajectory.query
        return TraceRecord(
            query_id=query.query_id,
            entity_id=query.entity_id,
            split=trajectory.split,
            field=query.field,
            ground_truth=query.ground_truth,
            seed=self.seed,
            substrate=self.substrate.name,
            method=self.method.name,
            steps=trajectory.steps,
            retrieval=trajectory.retrieval,
            answer=trajectory.answer,
            raw_reply="\n".join(trajectory.replies),
            halted_reason=trajectory.halted_reason,  # type: ignore[arg-type]
            summary=trajectory.summary,
            summary_error=trajectory.summary_error,
            answer_rule=self.config.answer_rule,
            question=query.question,
            form=query.form,
        )

    def run(self, items: Iterable[tuple[Query, Split]], on_record: Callable[[TraceRecord], None]) -> None:
        """Run every query; `on_record` gets each trace record as soon as its trajectory halts.

        A trajectory that halts without its summary triggers one summary call; since a summary
        does not depend on the trace, that call fills its batch with the queries still running
        or waiting, so every summary batch is full and no finished record waits for others.
        """
        waiting = deque(items)
        active: list[Trajectory] = []
        summaries: dict[str, tuple[str | None, str | None]] = {}
        batch_size = self.config.batch_size
        while waiting or active:
            while waiting and len(active) < batch_size:
                active.append(self.start(*waiting.popleft()))
            self.step_batch(active)
            halted = [t for t in active if t.done]
            active = [t for t in active if not t.done]
            needed = [t.query for t in halted if t.query.query_id not in summaries]
            while needed:
                wave = needed[:batch_size]
                needed = needed[batch_size:]
                if not needed:  # room left: the queries whose trajectories are still to finish
                    later = [t.query for t in active] + [q for q, _ in waiting]
                    wave += [q for q in later if q.query_id not in summaries][: batch_size - len(wave)]
                summaries.update({q.query_id: s for q, s in zip(wave, self.summarize(wave))})
            for trajectory in halted:
                trajectory.summary, trajectory.summary_error = summaries.pop(trajectory.query.query_id)
                on_record(self.record(trajectory))
