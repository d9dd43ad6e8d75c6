"""The `memory` stage (`kbench memory-run --system NAME`): one memory system of the memory lane
(SPEC §15; docs/memory.md) on every instance of `memory.instances`.

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
import functools
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kbench import io, tracking
from kbench.backends import Backend, backend_is_remote, build_backend
from kbench.backends.llama_cpp import ALIAS as LLAMA_CPP_ALIAS
from kbench.backends.llama_cpp import LlamaCppBackend, serve, stop_servers
from kbench.config import ModelConfig, Params
from kbench.memory.channels import MemoryTrace, channel_rates
from kbench.memory.instances import Instance, read_instances
from kbench.memory.records import ItemRecord, read_items, write_items
from kbench.memory.residue import residue_rates
from kbench.memory.scoring import score_items
from kbench.memory.systems import InstanceRun, LlmEndpoint, memory_system_class, memory_system_names, run_instance
from kbench.memory.traces import log_instances
from kbench.names import LANE_SCORES_FILE
from kbench.parametric.agent_base import agent_model_config
from kbench.serving import check_endpoint
from kbench.stages import option, track_option
from kbench.stages.inputs import shaping
from kbench.workers import run_items

log = logging.getLogger(__name__)


class MemoryStageError(ValueError):
    """A system's instances that failed in the pool (each named with its error)."""

COMMAND = "memory-run"
HELP = "run memory systems of the memory lane on its instances: items, scores (memory.*)"
ITEMS_FILE, SCORES_FILE, INFO_FILE, INPUTS_FILE = "items.jsonl", LANE_SCORES_FILE, "instances.json", "inputs.json"
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


@functools.cache
def _worker_backend(params_json: str) -> Backend:
    """A worker's model, loaded once per worker."""
    return build_backend(agent_model_config(Params.model_validate_json(params_json)))


def run_job(job: InstanceJob) -> InstanceRun:
    """One system on one instance, a fresh system per version."""
    backend = _worker_backend(job.params.model_dump_json())
    cls = memory_system_class(job.system)
    return run_instance(lambda: cls(backend, max_new_tokens=job.params.memory.max_new_tokens, endpoint=job.endpoint),
                        job.instance)


def run_system(params: Params, system: str, instances: list[Instance], *, track: bool) -> dict:
    """Run (or resume) one system on every instance; return its scores.json."""
    config = params.memory
    cls = memory_system_class(system)
    out = Path(config.out_dir) / system
    inputs = _inputs(params, system)
    info: dict[str, dict] = {}
    items: dict[str, list[ItemRecord]] = {}
    traces: dict[str, list[MemoryTrace]] = {}
    wanted = {i.instance_id: io.json_digest(i.model_dump(mode="json")) for i in instances}
    if (out / INPUTS_FILE).exists() and json.loads((out / INPUTS_FILE).read_text()) == inputs and (out / INFO_FILE).exists():
        kept = read_items([out / ITEMS_FILE]) if (out / ITEMS_FILE).exists() else []
        turns = _read_traces(out / TRACES_FILE) if (out / TRACES_FILE).exists() else []
        for iid, entry in json.loads((out / INFO_FILE).read_text()).items():
            if wanted.get(iid) == entry["digest"]:
                info[iid] = entry
                items[iid] = [r for r in kept if r.instance_id == iid]
                traces[iid] = [t for t in turns if t.entity_id == iid]
                if len(traces[iid]) != len(items[iid]):  # written before its traces were: run it again
                    del info[iid], items[iid], traces[iid]
    else:
        io.write_json(out / INPUTS_FILE, inputs)
    todo = [i for i in instances if i.instance_id not in info]
    log.info("%s: %d instances, %d finished before, %d to run", system, len(instances), len(info), len(todo))

    def write() -> None:  # in instance order, whatever ran before
        order = [i.instance_id for i in instances if i.instance_id in info]
        write_items(out / ITEMS_FILE, [r for iid in order for r in items[iid]])
        io.write_jsonl(out / TRACES_FILE, [t for iid in order for t in traces[iid]])
        io.write_json(out / INFO_FILE, {iid: info[iid] for iid in order})

    def finished(job: InstanceJob, run: InstanceRun, seconds: float) -> None:
        iid = job.instance.instance_id
        info[iid] = {"digest": wanted[iid], "tier": job.instance.tier, "failures": run.failures,
                     "seconds": round(seconds, 1), "memories": run.memories}
        items[iid], traces[iid] = run.items, run.traces
        write()
        log.info("%s: instance %s done in %.0f s, %d failed memory operations (%d/%d)", system, iid, seconds,
                 run.failures, len(info), len(instances))

    failed: list[str] = []
    if todo:
        endpoint = endpoint_for(params) if cls.needs_endpoint else contextlib.nullcontext(None)
        with endpoint as llm:
            jobs = [InstanceJob(params, system, instance, llm) for instance in todo]
            failed = run_items(run_job, jobs, params.execution.cell_workers, finished)
    if failed:
        raise MemoryStageError(f"{system}: instances failed: {'; '.join(failed)}")
    write()
    records = [r for i in instances for r in items[i.instance_id]]
    scores = score_items(records, resamples=config.resamples, seed=config.bootstrap_seed,
                           level=config.level)[system].to_json()
    scores["failures"] = sum(entry["failures"] for entry in info.values())
    scores["residue"] = residue_rates(records, {iid: entry["memories"] for iid, entry in info.items()})
    scores["channels"] = channel_rates(t for i in instances for t in traces[i.instance_id])
    io.write_json(out / SCORES_FILE, scores)
    metrics = {name: value for name, value in scores.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}
    if scores["residue"]["rate"] is not None:
        metrics["residue"] = scores["residue"]["rate"]
    metrics |= {f"FE.{t}": e["value"] for t, e in scores["fe_by_request_type"].items() if e["value"] is not None}
    metrics |= {f"AR.{a}": e["value"] for a, e in scores["ar_by_attack"].items() if e["value"] is not None}
    tracking.write_manifest(out, KIND_MEMORY, system, {tracking.TAG_BASE_MODEL: params.base_model}, metrics,
                            [ITEMS_FILE, SCORES_FILE, INFO_FILE, TRACES_FILE])
    if track:
        logged = tracking.find_run_id(tracking.open_experiment(params), KIND_MEMORY, system, io.folder_hash(out))
        run_id = tracking.log_output(params, out)
        if logged is None:  # a new run: its instances as traces
            log_instances(instances, records, info, run_id)
    return scores


def _read_traces(path: Path) -> list[MemoryTrace]:
    return [MemoryTrace.model_validate(data) for _, data in io.read_json_lines(path, MemoryStageError, "a probe trace")]


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
        log.info("%s: RA %s FE %s Score %s, %d failed memory operations", system, scores["RA"], scores["FE"],
                 scores["Score"], scores["failures"])
    return 0
