"""The `memory` stage (`kbench memory-run --system NAME`): one memory system of the memory lane
(docs/memory.md) on every instance of `memory.instances`.

DVC runs it once per system of `memory.systems` (a matrix). Each instance gets a fresh system
per version, fed the dialogue and asked every probe on the agent base, the instances side by
side on a pool of `execution.cell_workers` processes; the item records go to
`memory.out_dir/<system>/items.jsonl` (instance order), each reply as a trace record to
`probes.jsonl`, what each instance cost and what the system kept to `instances.json`, the scores to `scores.json`, and the system is logged as an
MLflow run with one trace per instance. A system whose library calls an LLM itself (`mem0`)
talks to `memory.llm_base_url`, or to a llama.cpp server this stage starts on 127.0.0.1 over the
agent base and stops after. Instances are written as they finish (atomically); a rerun keeps
every finished instance whose content and inputs are unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kbench import io, tracking
from kbench.backends import backend_is_remote
from kbench.backends.llama_cpp import ALIAS as LLAMA_CPP_ALIAS
from kbench.backends.llama_cpp import LlamaCppBackend, serve, stop_servers
from kbench.config import ModelConfig, Params
from kbench.memory.channels import MemoryTrace, channel_rates
from kbench.memory.instances import Instance, read_instances
from kbench.memory.records import ItemRecord, read_items, write_items
from kbench.memory.residue import residue_rates, stores_nothing
from kbench.memory.scoring import MemoryScores, memory_scores
from kbench.memory.systems import InstanceRun, LlmEndpoint, memory_system_class, memory_system_names, run_instance
from kbench.memory.traces import log_instances
from kbench.names import LANE_SCORES_FILE
from kbench.parametric.agent_base import agent_model_config
from kbench.serving import check_endpoint
from kbench.stages import option, track_option
from kbench.stages.inputs import shaping
from kbench.stages.unit import PartFiles, Parts, open_unit, worker_backend
from kbench.workers import run_items

log = logging.getLogger(__name__)


class MemoryStageError(ValueError):
    """A system's instances that failed in the pool (each named with its error)."""

COMMAND = "memory-run"
HELP = "run memory systems of the memory lane on its instances: items, scores (memory.*)"
ITEMS_FILE, SCORES_FILE, INFO_FILE = "items.jsonl", LANE_SCORES_FILE, "instances.json"
#: Every probe reply as a trace record (`kbench.memory.channels`), in items order; not traces.jsonl,
#: which would log each reply as an MLflow trace (the instances are logged as traces instead).
TRACES_FILE = "probes.jsonl"
KIND_MEMORY = "memory"


def _model_identity(model: ModelConfig) -> str:
    """The model's weights by their hash, or a served model by its name and address."""
    if not backend_is_remote(model.backend) and Path(model.path).is_dir():
        return io.folder_hash(model.path)
    return io.json_digest(model.model_dump(mode="json", include={"backend", "path", "base_url"}))


def _inputs(params: Params, system: str) -> dict:
    """What every finished instance of `system` depends on (besides the instance itself)."""
    return {"system": system, "params": shaping(params, "memory"), "model": _model_identity(agent_model_config(params))}


@contextlib.contextmanager
def endpoint_for(params: Params) -> Iterator[LlmEndpoint]:
    """`memory.llm_base_url`; else the run's own endpoint (`model.backend: openai`); else the run's
    own llama.cpp server (`model.backend: llama-cpp`); else a llama.cpp server over the agent base
    for the duration."""
    config = params.memory
    model = agent_model_config(params)
    served = backend_is_remote(model.backend)
    if config.llm_base_url or served:  # a user's endpoint, or the one the whole run is served by
        base_url = config.llm_base_url or model.base_url
        check_endpoint(base_url)
        yield LlmEndpoint(base_url, config.llm_model or (model.path if served else "default"), config.llm_max_tokens,
                          os.environ.get(model.api_key_env) or "local")  # the key the run's backend reads
        return
    if model.backend == LlamaCppBackend.name:  # this process's server over model.path
        yield LlmEndpoint(serve(model.path, os.cpu_count() or 1), LLAMA_CPP_ALIAS, config.llm_max_tokens)
        return
    alias = config.llm_model or "agent-base"  # the agent base, served for the stage's duration
    try:
        base_url = serve(model.path, os.cpu_count() or 1, n_ctx=config.llm_context, alias=alias)
        yield LlmEndpoint(base_url, alias, config.llm_max_tokens)
    finally:
        stop_servers()


@dataclass(frozen=True)
class InstanceJob:
    """One instance of one system, run in a pool worker (or in this process)."""

    params: Params
    system: str
    instance: Instance
    #: Where a system that calls an LLM itself sends its calls (the server outlives the pool).
    endpoint: LlmEndpoint | None

    def __str__(self) -> str:
        return f"{self.system} on {self.instance.instance_id}"


def run_job(job: InstanceJob) -> InstanceRun:
    """One system on one instance, a fresh system per version."""
    backend = worker_backend(agent_model_config(job.params))
    cls = memory_system_class(job.system)
    return run_instance(lambda: cls(backend, max_new_tokens=job.params.memory.max_new_tokens, endpoint=job.endpoint),
                        job.instance)


def _read_traces(path: Path) -> list[MemoryTrace]:
    return [MemoryTrace.model_validate(data) for _, data in io.read_json_lines(path, MemoryStageError, "a probe trace")]


#: A system's finished instances: their items, probe replies (as trace records) and what each cost and kept.
INSTANCE_FILES: PartFiles[ItemRecord, MemoryTrace] = PartFiles(
    records=ITEMS_FILE, traces=TRACES_FILE, info=INFO_FILE,
    read_records=lambda path: read_items([path]), write_records=write_items, read_traces=_read_traces,
    record_part=lambda record: record.instance_id, trace_part=lambda trace: trace.entity_id)


def run_system(params: Params, system: str, instances: list[Instance], *, track: bool) -> MemoryScores:
    """Run (or resume) one system on every instance; return its scores.json."""
    config = params.memory
    cls = memory_system_class(system)
    out = Path(config.out_dir) / system
    wanted = {i.instance_id: io.json_digest(i.model_dump(mode="json")) for i in instances}
    done = Parts(out, INSTANCE_FILES, [i.instance_id for i in instances])
    if open_unit(out, _inputs(params, system), what=f"memory system {system}"):
        # an instance is kept when its content is unchanged and its traces were written with its items
        done.resume(lambda iid, entry, items, traces: wanted[iid] == entry["digest"] and len(traces) == len(items))
    todo = [i for i in instances if i.instance_id not in done]
    log.info("%s: %d instances, %d finished before, %d to run", system, len(instances), len(done), len(todo))

    def finished(job: InstanceJob, run: InstanceRun, seconds: float) -> None:
        iid = job.instance.instance_id
        done.add(iid, {"digest": wanted[iid], "tier": job.instance.tier, "failures": run.failures,
                       "seconds": round(seconds, 1), "memories": run.memories}, run.items, run.traces)
        log.info("%s: instance %s done in %.0f s, %d failed memory operations (%d/%d)", system, iid, seconds,
                 run.failures, len(done), len(instances))

    failed: list[str] = []
    if todo:
        endpoint = endpoint_for(params) if cls.needs_endpoint else contextlib.nullcontext(None)
        with endpoint as llm:
            jobs = [InstanceJob(params, system, instance, llm) for instance in todo]
            failed = run_items(run_job, jobs, params.execution.cell_workers, finished)
    if failed:
        raise MemoryStageError(f"{system}: instances failed: {'; '.join(failed)}")
    done.write()
    info, records = done.infos(), done.records()
    memories = {iid: entry["memories"] for iid, entry in info.items()}
    scores = memory_scores(records, system, failures=sum(entry["failures"] for entry in info.values()),
                           residue=residue_rates(records, memories), stores_nothing=stores_nothing(records, memories),
                           channels=channel_rates(done.traces()), resamples=config.resamples,
                           seed=config.bootstrap_seed, level=config.level)
    io.write_json(out / SCORES_FILE, scores.model_dump(mode="json"))
    tracking.record_output(params, out, KIND_MEMORY, system, tags={tracking.TAG_BASE_MODEL: params.base_model},
                           metrics=scores.mlflow_metrics(), artifacts=[ITEMS_FILE, SCORES_FILE, INFO_FILE, TRACES_FILE],
                           track=track, on_new_run=lambda run_id: log_instances(instances, records, info, run_id))
    return scores


def check_systems(names: list[str]) -> None:
    """Every system named is registered (the error lists the registered ones)."""
    for name in names:
        memory_system_class(name)
    if not names:
        raise ValueError(f"no memory system to run; registered: {memory_system_names()}")


@dataclass(frozen=True)
class Options:
    """`kbench memory-run`'s options."""

    #: The systems to run; empty: `memory.systems`.
    system: tuple[str, ...] = option((), "a memory system (repeatable; default: memory.systems)")
    #: Record each system as an MLflow run.
    track: bool = track_option()


def main(params: Params, options: Options) -> int:
    systems = list(options.system) or list(params.memory.systems)
    check_systems(systems)
    instances = read_instances(params.memory.instances)
    for system in systems:
        scores = run_system(params, system, instances, track=options.track)
        log.info("%s: RA %s FE %s Score %s, %d failed memory operations", system, scores.RA, scores.FE, scores.Score,
                 scores.failures)
    return 0
