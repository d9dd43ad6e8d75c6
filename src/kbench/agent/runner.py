"""Deploy one cell's agent (substrate × method × seed) and run its queries, appending traces.

Records are appended to traces.jsonl as trajectories finish, so an interrupted cell resumes
where it stopped: query ids already in the file are skipped (never run twice), and a last
line cut short by the interruption is dropped before appending.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from kbench.agent.react import ReActAgent
from kbench.backends import Backend, build_backend
from kbench.config import ModelConfig, Params
from kbench.corpus import Corpus
from kbench.methods import Fitted, Method, MethodContext, MethodError, build_method
from kbench.methods.unlearning import Unlearned
from kbench.records import Query, Split, TraceFormatError, TraceRecord, parse_trace_line
from kbench.substrates import build_substrate

log = logging.getLogger(__name__)


def setup_cell(
    params: Params,
    corpus: Corpus,
    model: ModelConfig,
    *,
    substrate: str,
    method: str,
    seed: int,
    index_dir: str | Path | None = None,
    adapter_path: str | None = None,
    merge_adapter: bool = False,
    fitted: Fitted | None = None,
    unlearned: Unlearned | None = None,
) -> ReActAgent:
    """Build the deployed agent of one cell.

    `model` is the agent's model section (`kbench.parametric.agent_model_config`);
    `adapter_path` is the P adapter, or the LoRA-D control adapter on another substrate;
    `merge_adapter` merges it into the weights (the merged-weight variant of P); `fitted` is
    what the `fit` stage learned for a method that fits (`kbench.methods.fitting.load_fitted`);
    `unlearned` is the `unlearn` stage's checked folder for a weight method.
    """
    cell_substrate = build_substrate(
        substrate, corpus, params.agent, seed=seed, index_dir=index_dir, adapter_path=adapter_path
    )
    backend, cell_method = deployed_model(
        params, corpus, model, substrate=substrate, method=method, seed=seed,
        adapter_path=cell_substrate.adapter_path, merge_adapter=merge_adapter, fitted=fitted, unlearned=unlearned,
    )
    return ReActAgent(backend, cell_substrate, cell_method, params.agent, seed=seed)


def deployed_model(
    params: Params,
    corpus: Corpus,
    model: ModelConfig,
    *,
    substrate: str,
    method: str,
    seed: int,
    adapter_path: str | None = None,
    merge_adapter: bool = False,
    fitted: Fitted | None = None,
    unlearned: Unlearned | None = None,
) -> tuple[Backend, Method]:
    """The model a cell deploys and its method, ready (what the agent runs, and what the
    direct probes read without an agent): the adapter loaded, the method's artifacts taken
    back, its weight edit applied."""
    cell_method = build_method(method, MethodContext(corpus, params, seed))
    backend = build_backend(model)
    cell_method.check_deployable(substrate, backend)
    if adapter_path is not None:
        backend.load_adapter(adapter_path, merge=merge_adapter)
    if cell_method.fits:
        if fitted is None:
            raise MethodError(f"method {method!r} fits in the `fit` stage; its cell needs the fitted artifact")
        cell_method.load_fitted(fitted)
    if cell_method.trains:
        if unlearned is None:
            raise MethodError(f"method {method!r} trains in the `unlearn` stage; its cell needs the unlearned weights")
        cell_method.load_unlearned(unlearned)
    if "weights" in cell_method.hooks:
        cell_method.edit_weights(backend)
    return backend, cell_method


def read_finished(traces_path: Path) -> list[TraceRecord]:
    """Records already in the file. An interrupted write leaves a last line without its newline:
    if it is not a valid record it is cut off the file (its query is rerun)."""
    if not traces_path.exists():
        return []
    raw = traces_path.read_bytes()
    head, newline, tail = raw.rpartition(b"\n")
    complete = head + newline
    records = [
        parse_trace_line(line, source=str(traces_path), lineno=lineno)
        for lineno, line in enumerate(complete.decode("utf-8").splitlines(), start=1)
        if line.strip()
    ]
    if tail.strip():
        try:
            records.append(parse_trace_line(tail.decode("utf-8", errors="replace")))
            with traces_path.open("ab") as handle:
                handle.write(b"\n")
        except TraceFormatError:
            log.warning("%s: dropping a truncated last line (its query is rerun)", traces_path)
            with traces_path.open("r+b") as handle:
                handle.truncate(len(complete))
    return records


def _check_same_cell(records: Sequence[TraceRecord], agent: ReActAgent, traces_path: Path) -> None:
    for record in records:
        cell = (record.substrate, record.method, record.seed)
        if cell != (agent.substrate.name, agent.method.name, agent.seed):
            raise ValueError(
                f"{traces_path} holds a trace of cell {cell} ({record.query_id}); this cell is "
                f"{(agent.substrate.name, agent.method.name, agent.seed)}. Use another file."
            )


def run_cell(
    agent: ReActAgent,
    items: Sequence[tuple[Query, Split]],
    traces_path: str | Path,
    *,
    progress: bool = True,
) -> list[TraceRecord]:
    """Run every (query, split) not yet in `traces_path`; return all the cell's records."""
    traces_path = Path(traces_path)
    traces_path.parent.mkdir(parents=True, exist_ok=True)
    finished = read_finished(traces_path)
    _check_same_cell(finished, agent, traces_path)
    done = {r.query_id for r in finished}
    todo: list[tuple[Query, Split]] = []
    for query, split in items:
        if query.query_id not in done:
            done.add(query.query_id)
            todo.append((query, split))
    torch.manual_seed(agent.seed)  # greedy decoding is deterministic; seeded for any sampling hook
    records = list(finished)
    bar = tqdm(
        total=len(finished) + len(todo), initial=len(finished), unit="query",
        desc=f"{agent.substrate.name}/{agent.method.name}/seed {agent.seed}", disable=not progress,
    )
    started = time.perf_counter()
    with traces_path.open("a", encoding="utf-8") as handle, bar:

        def append(record: TraceRecord) -> None:
            handle.write(record.model_dump_json() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            records.append(record)
            bar.update(1)
            rate = (len(records) - len(finished)) / max(time.perf_counter() - started, 1e-9)
            bar.set_postfix(traj_per_s=f"{rate:.2f}")

        agent.run(todo, append)
    return records
