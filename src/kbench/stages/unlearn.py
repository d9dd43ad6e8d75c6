"""The `unlearn` stage (`kbench unlearn`): every weight method of the design, trained on the P
target once per recipe in `p_recipes` under the matched budget (`unlearning`).

Forget set: the records (injection.mix) of the forget entities LoRA-T+D learned; retain set:
its retain records. Recipe lora continues LoRA-T+D itself; recipe merged (and O3, which keeps
the target untouched) trains a fresh LoRA (`unlearning.lora`) on top of the merged target.
Each run writes `<unlearning.out_dir>/<method>/<recipe>/` atomically: the peft adapter,
`injection.json` (the adapter record plus the run's budget, declared exceptions, inputs
digest and per-step curves) and hashes; it is checked like every injection folder and
logged as an MLflow run of kind `unlearn` with its curves per step. A rerun skips a folder
made from the same inputs, so an interrupted stage resumes.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kbench import io, tracking
from kbench.backends.hf import load_model
from kbench.config import Params
from kbench.corpus import Corpus, load_corpus
from kbench.design import require_weights
from kbench.methods import MethodContext, MethodError, build_method, method_class
from kbench.methods.unlearning import (
    CONTINUED,
    STACKED,
    UNLEARNING_KEY,
    WeightMethod,
    method_budget,
    refusal_chat,
)
from kbench.names import HF_BACKEND, LORA, P_RECIPES
from kbench.parametric.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_DIRS,
    ADAPTER_KIND,
    INJECTION_FILE,
    TARGET,
    InjectionError,
    Injected,
    check_injected,
    settle_adapter_config,
)
from kbench.parametric.agent_base import agent_model_config
from kbench.parametric.injection import ASSISTANT_SYSTEM, record_conversations, training_entities
from kbench.parametric.lora import Example, tokenize_chat
from kbench.parametric.unlearning import (
    UnlearningError,
    check_unlearned,
    total_steps,
    train_unlearning,
    unlearned_dir,
)
from kbench.records import FORGET
from kbench.stages import option, track_option
from kbench.stages.corpus import corpus_option
from kbench.stages.inputs import shaping
from kbench.workers import run_pool

log = logging.getLogger(__name__)

COMMAND = "unlearn"
HELP = "train the weight methods on the P target (unlearning.*)"


def weight_methods(params: Params) -> list[str]:
    """The methods the stage trains: each weight method of `methods` under the name its weights
    are kept (an O3 accuracy variant deploys o3's), in order, once each."""
    names: list[str] = []
    for name in params.methods:
        cls = method_class(name)
        if cls.trains and cls.trained_as() not in names:
            names.append(cls.trained_as())
    return names


def target_adapter(params: Params) -> Path:
    return Path(params.injection.out_dir) / ADAPTER_DIRS[TARGET]


def unlearning_sets(tokenizer: Any, corpus: Corpus, params: Params) -> dict[str, list[Example]]:
    """The distinct forget and retain records LoRA-T+D learned (the copies `injection.mix`
    repeats are one record), and each forget record with a refusal answer (`alternate`,
    aligned with `forget`)."""
    sets: dict[str, list[Example]] = {"forget": [], "retain": [], "alternate": []}
    max_length = params.injection.lora.max_length
    for entity_id in training_entities(corpus, params)[TARGET]:
        entity = corpus.entities[entity_id]
        chats = record_conversations(entity, params.injection.mix, params.agent.max_iters)
        forget = corpus.split_of(entity_id) == FORGET
        seen: set[tuple[int, ...]] = set()
        for index, chat in enumerate(chats):
            chat = [dict(message) for message in chat]
            example = tokenize_chat(tokenizer, chat, max_length)
            if tuple(example.input_ids) in seen:  # a record the mix repeats (bio x 3) is one record here
                continue
            seen.add(tuple(example.input_ids))
            sets["forget" if forget else "retain"].append(example)
            if forget:
                react = chat[0]["content"] != ASSISTANT_SYSTEM
                sets["alternate"].append(tokenize_chat(tokenizer, refusal_chat(chat, entity.name, react, index), max_length))
    return sets


def _inputs_digest(params: Params, name: str, recipe: str, source_hash: str, corpus_fingerprint: str) -> str:
    """Everything that shapes one run's weights: a folder made from other inputs is retrained."""
    budget, _ = method_budget(name, params)
    return io.json_digest({
        "method": name, "recipe": recipe, "source": source_hash, "corpus": corpus_fingerprint,
        "budget": budget.model_dump(mode="json", exclude={"out_dir"}),  # where it is written shapes nothing
        **shaping(params, "unlearn", method=name),  # the stage's declared inputs
    })


def _trainable_model(params: Params, base_dir: Path, kind: str) -> tuple[Any, Any]:
    """The model a run trains: LoRA-T+D loaded trainable (CONTINUED), or a fresh seeded LoRA on
    top of the merged target (STACKED)."""
    import peft

    model, tokenizer = load_model(params.model, base_dir)
    adapter = str(target_adapter(params))
    if kind == CONTINUED:
        return peft.PeftModel.from_pretrained(model, adapter, is_trainable=True), tokenizer
    merged = peft.PeftModel.from_pretrained(model, adapter).merge_and_unload()
    settings = params.unlearning.lora
    torch.manual_seed(params.unlearning.seed)
    target = settings.target_modules if isinstance(settings.target_modules, str) else list(settings.target_modules)
    config = peft.LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=0.0,
                             target_modules=target, task_type="CAUSAL_LM")
    return peft.get_peft_model(merged, config), tokenizer


def _finished(folder: Path, base_dir: Path, name: str, recipe: str, source_hash: str, digest: str) -> bool:
    """Whether `folder` already holds this run (same inputs, passes its check): resume skips it."""
    if not folder.exists():
        return False
    try:
        unlearned = check_unlearned(folder, base_dir, method=name, recipe=recipe, source_hash=source_hash)
    except InjectionError as exc:
        log.warning("%s: %s; training it again", folder, exc)
        return False
    return unlearned.info.get("inputs") == digest and (folder / tracking.RUN_MANIFEST).exists()


def train_one(params: Params, corpus: Corpus, base_dir: Path, name: str, recipe: str, *, target: Injected,
              source_hash: str, digest: str, track: bool, caches: dict | None = None) -> dict[str, float]:
    """Train one weight method on one recipe from the checked LoRA-T+D `target`; write, check
    and record its folder."""
    method = build_method(name, MethodContext(corpus, params, seed=0))
    if not isinstance(method, WeightMethod):
        raise MethodError(f"method {name!r} is not a weight method (kbench.methods.unlearning.WeightMethod)")
    budget, exceptions = method_budget(name, params)
    kind = CONTINUED if recipe == LORA and not method.own_adapter else STACKED
    model, tokenizer = _trainable_model(params, base_dir, kind)
    method.begin(model, target_adapter(params))
    sets = unlearning_sets(tokenizer, corpus, params)
    log.info("unlearn %s (%s, %s): %d forget and %d retain examples, %d steps", name, recipe, kind,
             len(sets["forget"]), len(sets["retain"]), total_steps(len(sets["forget"]), budget))
    started = time.perf_counter()
    run = train_unlearning(
        model, method, sets["forget"], sets["retain"], budget,
        alternates=sets["alternate"] if method.needs_alternates else None, hidden_layer=method.hidden_layer(),
        # runs from the same starting weights and budget see the same batches: one reference pass each
        reference_cache=None if caches is None else caches.setdefault(
            (recipe, kind, json.dumps(budget.model_dump(mode="json"), sort_keys=True)), {}),
    )
    seconds = time.perf_counter() - started
    folder = unlearned_dir(params.unlearning.out_dir, name, recipe)
    curves = run.curves()
    metrics = {
        "steps": float(len(run.loss)),
        "first_loss": run.loss[0], "final_loss": run.loss[-1],
        **{f"final_{k}": v[-1] for k, v in curves.items() if v and v[-1] is not None and k != "learning_rate"},
    }
    info = {
        "kind": ADAPTER_KIND, "role": TARGET, "entities": list(target.entities),
        "base_fingerprint": target.base_fingerprint, "base_model": str(base_dir),
        UNLEARNING_KEY: {
            "method": name, "recipe": recipe, "kind": kind, "source_hash": source_hash, "inputs": digest,
            "config": method.config.model_dump(mode="json"), "budget": budget.model_dump(mode="json"),
            "budget_exceptions": exceptions,
            "n_forget": len(sets["forget"]), "n_retain": len(sets["retain"]),
            "curves": curves,
        },
        "metrics": metrics,
    }  # no timing here: the same params give the same bytes (the time is in the log)
    with io.atomic_dir(folder) as partial:
        model.save_pretrained(partial)
        settle_adapter_config(partial)
        io.write_json(partial / INJECTION_FILE, info)
        io.write_hashes(partial)
    check_unlearned(folder, base_dir, method=name, recipe=recipe, source_hash=source_hash)
    tracking.record_output(
        params, folder, tracking.KIND_UNLEARN, unlearn_key(params, name, recipe),
        tags={tracking.TAG_BASE_MODEL: params.base_model, tracking.TAG_METHOD: name, tracking.TAG_RECIPE: recipe,
              tracking.TAG_BUDGET_EXCEPTIONS: json.dumps(exceptions, sort_keys=True)},
        metrics=metrics, artifacts=[INJECTION_FILE, ADAPTER_CONFIG], track=track, curves=curves,
    )
    log.info("unlearn %s (%s) in %.1f s: %s", name, recipe, seconds, metrics)
    return metrics


def unlearn_key(params: Params, name: str, recipe: str) -> str:
    """The MLflow key of one unlearn run (a cell's `kbench.unlearn_key` tag points to it)."""
    return f"{params.base_model}/{name}/{recipe}"


def _checked_target(params: Params) -> tuple[Path, Injected, str]:
    """The agent base folder, the checked LoRA-T+D every run starts from, and its hash."""
    model_config = agent_model_config(params)
    if model_config.backend != HF_BACKEND:
        raise MethodError(f"weight methods ({', '.join(weight_methods(params))}) train model weights; the "
                          f"{model_config.backend} backend has none (use model.backend: hf)")
    base_dir = Path(model_config.path)
    return base_dir, check_injected(target_adapter(params), base_dir, role=TARGET), io.folder_hash(target_adapter(params))


@dataclass(frozen=True)
class UnlearnRun:
    """One weight method's training on one recipe, as a pool worker is handed it."""

    #: The design.
    params: Params
    #: The corpus the forget and retain sets come from.
    corpus: Corpus
    #: The method, under the name its weights are kept.
    name: str
    #: The P recipe.
    recipe: str
    #: The run's inputs digest (`_inputs_digest`).
    digest: str
    #: The agent base, the checked LoRA-T+D and its hash (`_checked_target`, checked once by the stage).
    base_dir: Path
    target: Injected
    source_hash: str


#: A pool worker's reference passes, shared by the runs it trains (runs from the same starting
#: weights and budget see the same batches).
_WORKER_CACHES: dict[tuple, dict] = {}


def train(job: UnlearnRun) -> None:
    """A pool worker's task: one run, untracked (the stage's process logs it)."""
    train_one(job.params, job.corpus, job.base_dir, job.name, job.recipe, target=job.target,
              source_hash=job.source_hash, digest=job.digest, track=False, caches=_WORKER_CACHES)


def run_unlearn_stage(params: Params, corpus: Corpus, *, track: bool = True,
                      runs: list[tuple[str, str]] | None = None, workers: int = 1) -> dict[str, dict]:
    """Train every weight method of the design on every P recipe, or only `runs` ((method,
    recipe) pairs), resuming finished ones. With `workers` > 1 the runs go through a pool of
    that many processes (`kbench.workers.run_pool`); this process logs each to MLflow."""
    names = weight_methods(params)
    grid = [(name, recipe) for recipe in params.p_recipes for name in names]
    if runs is not None:
        for name, recipe in runs:
            if name not in names:
                raise MethodError(f"method {name!r} is not a weight method of this design (its weight methods: {names})")
            if recipe not in P_RECIPES:
                raise MethodError(f"unknown P recipe {recipe!r}; expected one of {list(P_RECIPES)}")
        grid = list(runs)
    Path(params.unlearning.out_dir).mkdir(parents=True, exist_ok=True)
    if not grid:
        log.info("unlearn: no weight method in the design")
        return {}
    for name in names:
        method_budget(name, params)  # an undeclared budget override fails before any training
    base_dir, target, source_hash = _checked_target(params)
    corpus_fingerprint = corpus.fingerprint()
    todo = []
    for name, recipe in grid:
        digest = _inputs_digest(params, name, recipe, source_hash, corpus_fingerprint)
        folder = unlearned_dir(params.unlearning.out_dir, name, recipe)
        if _finished(folder, base_dir, name, recipe, source_hash, digest):
            log.info("unlearn %s (%s): finished earlier with the same inputs, kept", name, recipe)
            if track:
                tracking.log_output(params, folder)
        else:
            todo.append((name, recipe, digest))
    if workers > 1 and len(todo) > 1:
        def logged(job: UnlearnRun, _: None, seconds: float) -> None:
            log.info("unlearn %s/%s finished in %.0f s", job.name, job.recipe, seconds)
            if track:
                tracking.log_output(params, unlearned_dir(params.unlearning.out_dir, job.name, job.recipe))

        # Each worker trains the runs it is handed one after the other, sharing reference passes.
        jobs = [UnlearnRun(params, corpus, name, recipe, digest, base_dir, target, source_hash)
                for name, recipe, digest in todo]
        failed = run_pool(train, jobs, workers, logged, label=lambda job: f"{job.name}/{job.recipe}")
        if failed:
            raise UnlearningError(f"unlearning runs failed: {', '.join(failed)} (their messages are above; "
                                  "finished runs are kept and a rerun resumes)")
    else:
        caches: dict[tuple, dict] = {}
        for name, recipe, digest in todo:
            train_one(params, corpus, base_dir, name, recipe, target=target, source_hash=source_hash, digest=digest,
                      track=track, caches=caches)
    return {
        f"{name}/{recipe}": json.loads((unlearned_dir(params.unlearning.out_dir, name, recipe) / INJECTION_FILE)
                                       .read_text())["metrics"]
        for name, recipe in grid
    }


@dataclass(frozen=True)
class Options:
    """`kbench unlearn`'s options."""

    #: The corpus the forget and retain sets come from.
    corpus: Path = corpus_option()
    #: One weight method only; None: every one in `methods`.
    method: str | None = option(None, "train this weight method only (default: every one in `methods`)")
    #: One P recipe only; None: every one in `p_recipes`.
    recipe: str | None = option(None, "this P recipe only (default: every one in p_recipes)", choices=P_RECIPES)
    #: Only these "METHOD/RECIPE" runs.
    run: tuple[str, ...] = option((), "train this run only (repeatable)", metavar="METHOD/RECIPE")
    #: Runs side by side; None: `execution.unlearn_workers`.
    workers: int | None = option(None, "runs side by side, in a process pool (default: execution.unlearn_workers)")
    #: Record each run as an MLflow run.
    track: bool = track_option()


def main(params: Params, options: Options) -> int:
    """Train every weight method of the design on the P target (unlearning.*, method_params.*)."""
    if weight_methods(params) and params.p_recipes:
        require_weights(params, "unlearn", "trains the weight methods' adapters on the model's weights")
    runs = None
    if options.run:
        runs = [tuple(run.partition("/")[::2]) for run in options.run]
    elif options.method or options.recipe:
        runs = [(name, recipe) for recipe in ([options.recipe] if options.recipe else params.p_recipes)
                for name in ([options.method] if options.method else weight_methods(params))]
    results = run_unlearn_stage(
        params, load_corpus(options.corpus), track=options.track, runs=runs,
        workers=params.execution.unlearn_workers if options.workers is None else options.workers,
    )
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0
