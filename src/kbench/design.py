"""The design a params file defines, checked against the registries before any stage runs.

`kbench.config` checks the schema (keys, types, ranges); this module checks what only the
registries know: that `model.backend`, every entry of `substrates`, every entry of `methods`
and `scoring.rule` name a registered backend, substrate, method and scoring rule. An unknown
name fails at start-up naming the key and the registered names. On a backend without weights
(an endpoint) it also refuses what needs them: weight and forward-hook methods, substrate P and
the agent base; the stages that need them call `require_weights` first (docs/models.md).

`Design` is which cells a params file defines and under what conditions they run: the
comparison reads only the cell runs of one design (docs/comparison.md).
"""

from __future__ import annotations

import hashlib
import json
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from kbench.backends import backend_has_weights, backend_is_remote, backend_names, backend_serves_adapters
from kbench.config import DEFAULT_PARAMS, GENERATED, Params, ParamsError, load_params, redact_url
from kbench.corpus import CorpusError, pool_sizes
from kbench.forms import CANONICAL, form_names
from kbench.methods import method_class, method_names, resolve_methods
from kbench.methods.base import WEIGHT_HOOKS
from kbench.names import ADAPTER_FREE, BASELINE_METHOD, CONTROL, HF_BACKEND, LORA, PARAMETRIC
from kbench.records import SPLITS
from kbench.observer.matcher import scoring_rule_names
from kbench.substrates import substrate_names

#: Params sections that shape every cell of a design besides the cell's own key (substrate,
#: recipe, method, seed): the corpus, the queries, the model and the agent that runs it. Each
#: is a DVC parameter of the cell stages, so a change re-runs (and re-tags) every cell.
DESIGN_SECTIONS = ("corpus", "queries", "model", "agent", "agent_base")


def _check(names: list[str], registered: list[str], key: str, kind: str) -> None:
    unknown = [name for name in names if name not in registered]
    if unknown:
        raise ParamsError(f"key '{key}': unknown {kind}(s) {unknown}; registered: {registered}")


def _check_unique(values: list, key: str) -> None:
    repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
    if repeated:
        raise ParamsError(f"key '{key}': {repeated} listed more than once")


def _check_grid(params: Params) -> None:
    """Non-empty, repeat-free grids; every method reaches a substrate of the design."""
    for key in ("seeds", "methods", "substrates"):
        if not getattr(params, key):
            raise ParamsError(f"key '{key}': empty; the design needs at least one")
        _check_unique(list(getattr(params, key)), key)
    _check_unique(list(params.p_recipes), "p_recipes")
    _check_unique(list(params.queries.forms), "queries.forms")
    if PARAMETRIC in params.substrates:
        raise ParamsError(f"key 'substrates': lists the adapter-free substrates; {PARAMETRIC} runs "
                          "with each of p_recipes")
    reached = {*params.substrates, *([PARAMETRIC] if params.p_recipes else [])}
    for name in params.methods:
        acts_on = method_class(name).substrates
        if not acts_on & reached:
            raise ParamsError(
                f"key 'methods': method {name!r} acts on {sorted(acts_on)}, none of which is in the design "
                f"(substrates {list(params.substrates)}, p_recipes {list(params.p_recipes)})"
            )


#: What to run instead when a backend without weights meets something that needs them.
ENDPOINT_HINT = "an endpoint runs the adapter-free cells only (presets/endpoint.yaml, docs/models.md)"
#: The same, for a backend whose server applies LoRA adapters by name.
SERVED_HINT = ("a server that applies adapters by name runs the adapter-free cells, the LoRA-D controls and P's "
               "recipe lora with none, gold and the weight methods that train one adapter (docs/models.md)")


def _check_endpoint(params: Params) -> None:
    """On a backend without weights (an endpoint), refuse what needs them, before any stage work:
    methods with a weight or forward hook (or weights trained for them), substrate P (its
    adapters load into the weights) and the agent base (a LoRA trained on them). A backend whose
    server applies adapters by name (vLLM) keeps P's unmerged recipe and the weight methods
    whose weights are one adapter."""
    backend = params.model.backend
    if backend_has_weights(backend):
        return
    served = backend_serves_adapters(backend)
    hint = SERVED_HINT if served else ENDPOINT_HINT
    hooked = []
    for name in params.methods:
        cls = method_class(name)
        if cls.runs_without_weights(served):
            continue
        hooks = sorted(cls.hooks & WEIGHT_HOOKS)
        hooked.append(f"{name} ({'/'.join(hooks) + ' hook' if hooks else 'trained weights'})")
    if hooked:
        raise ParamsError(f"key 'methods': {', '.join(hooked)} edit or hook the model's weights; the {backend} "
                          f"backend exposes none: drop them; {hint}")
    if params.p_recipes and not served:
        raise ParamsError(f"key 'p_recipes': substrate P loads its LoRA adapters into the model's weights; the "
                          f"{backend} backend exposes none: set p_recipes: []; {hint}")
    merged = [recipe for recipe in params.p_recipes if recipe != LORA]
    if merged:
        raise ParamsError(f"key 'p_recipes': recipe {merged[0]} merges LoRA-T+D into the model's weights; the "
                          f"{backend} backend reaches adapters its server applies unmerged: set p_recipes: [{LORA}]; "
                          f"{hint}")
    if params.agent_base.enabled:
        raise ParamsError(f"key 'agent_base.enabled': the agent base is a LoRA trained on the model's weights; "
                          f"the {backend} backend exposes none: set it to false; {hint}")


def require_weights(params: Params, stage: str, why: str, *, served: bool = False) -> None:
    """A stage that needs the model's weights refuses a backend without them in one line (as
    ParamsError), before any work: `why` says what it does with them. `served`: a backend whose
    server applies the stage's adapters by name will do."""
    backend = params.model.backend
    serves = backend_serves_adapters(backend)
    if backend_has_weights(backend) or (served and serves):
        return
    if serves:
        tail = f"run it on model.backend: {HF_BACKEND}; the server then applies the adapters by name (docs/models.md)"
    elif served:
        tail = f"it serves no adapters either; {ENDPOINT_HINT}"
    else:
        tail = "an endpoint runs the adapter-free cells only: `dvc repro cell` (docs/models.md)"
    raise ParamsError(f"the {stage} stage {why}; the {backend} backend exposes none; {tail}")


def check_pools(params: Params) -> None:
    """A generated corpus's eval pools hold `queries.n_per_split` queries (an imported corpus is
    checked when the corpus stage reads it, `kbench.stages.corpus`)."""
    if params.corpus.source != GENERATED:
        return
    try:
        sizes = pool_sizes(params.corpus)
    except CorpusError as exc:
        raise ParamsError(f"key 'corpus.n_entities': {exc}") from None
    for split in SPLITS:
        available = sizes[f"{split}_eval"] * len(params.queries.fields)
        if params.queries.n_per_split > available:
            raise ParamsError(
                f"key 'queries.n_per_split': {params.queries.n_per_split} queries per split, but the "
                f"{split} eval pool holds {available} ({sizes[f'{split}_eval']} entities x "
                f"{len(params.queries.fields)} fields)"
            )


def check_design(params: Params, *, source: str = "params") -> Params:
    """`params` with its methods resolved (`methods: all` expanded, each method's section filled
    in: `kbench.methods.resolve_methods`) if every registered name it uses is registered and its
    grid can run; else ParamsError naming the key."""
    try:
        params = resolve_methods(params)
        _check([params.model.backend], backend_names(), "model.backend", "backend")
        _check(params.substrates, substrate_names(), "substrates", "substrate")
        _check(params.methods, method_names(), "methods", "method")
        _check([params.scoring.rule], scoring_rule_names(), "scoring.rule", "scoring rule")
        _check(params.queries.forms, [f for f in form_names() if f != CANONICAL], "queries.forms", "query form")
        _check_endpoint(params)
        _check_grid(params)
        check_pools(params)
    except ParamsError as exc:
        raise ParamsError(f"{source}: {exc}") from None
    return params


def check_model_present(params: Params, *, source: str = "params", timeout_s: float = 3.0) -> None:
    """The hf backend's `model.path` is a model folder (what `make setup` / `kbench setup`
    builds), or a .gguf file for a backend that serves one itself; an endpoint backend's
    `model.base_url` accepts a connection."""
    if backend_is_remote(params.model.backend):
        url = urlsplit(params.model.base_url or "")
        if not url.hostname:
            raise ParamsError(f"{source}: key 'model.base_url': the {params.model.backend} backend needs the "
                              "endpoint's URL (e.g. http://127.0.0.1:8000/v1)")
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname, port), timeout=timeout_s).close()
        except OSError as exc:
            raise ParamsError(f"{source}: key 'model.base_url': nothing answers at {redact_url(params.model.base_url)} "
                              f"({type(exc).__name__}); start the server or fix the URL") from None
        return
    folder = Path(params.model.path)
    served_file = params.model.backend != HF_BACKEND and folder.suffix == ".gguf" and folder.is_file()
    if not (folder / "config.json").is_file() and not served_file:
        raise ParamsError(
            f"{source}: key 'model.path': {folder} is not a model folder (no config.json); run "
            "`make setup` (or `kbench setup`) for the default model, or point model.path at a "
            "Hugging Face causal-LM folder"
        )


def load_design(path: str | Path = DEFAULT_PARAMS) -> Params:
    """A params file read, validated against the schema, resolved and checked against the
    registries: what every stage runs on (`check_design`)."""
    return check_design(load_params(path), source=str(path))


def design_digest(params: Params) -> str:
    """Digest of the `DESIGN_SECTIONS` of the params: equal exactly when they are equal."""
    shaping = params.model_dump(include=set(DESIGN_SECTIONS), mode="json")
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Design:
    """The cells a params file defines and the conditions they run under (docs/comparison.md).

    Cells: every adapter-free substrate of `substrates` and P with each of `p_recipes`, crossed
    with `methods` and `seeds`, plus the LoRA-D control (`none` with the distractor-only
    adapter) on every adapter-free substrate. Conditions: the base model, the queries per
    split and seed, and the digest of the sections that shape every cell.
    """

    base_model: str
    #: Adapter-free substrates (`params.substrates`); P is in the design with its `p_recipes`.
    substrates: tuple[str, ...]
    p_recipes: tuple[str, ...]
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    n_per_split: int
    digest: str

    @classmethod
    def of(cls, params: Params) -> "Design":
        return cls(
            base_model=params.base_model,
            substrates=tuple(params.substrates),
            p_recipes=tuple(params.p_recipes),
            methods=tuple(params.methods),
            seeds=tuple(params.seeds),
            n_per_split=params.queries.n_per_split,
            digest=design_digest(params),
        )

    def _recipes(self, substrate: str) -> tuple[str, ...]:
        if substrate == PARAMETRIC:
            return self.p_recipes
        return (ADAPTER_FREE, CONTROL) if substrate in self.substrates else ()

    def excludes(
        self, *, base_model: str, substrate: str, recipe: str, method: str, seed: int,
        n_per_split: str | None, digest: str | None,
    ) -> str | None:
        """Why a cell run is not of this design (its tags as arguments), or None if it is.

        `n_per_split` and `digest` are the run's tags as written (None: the run has none).
        """
        if base_model != self.base_model:
            return f"base model {base_model}, not {self.base_model}"
        recipes = self._recipes(substrate)
        if not recipes:
            return f"substrate {substrate} is not in the design"
        if recipe not in recipes:
            return f"recipe {recipe} of {substrate} is not in the design ({', '.join(recipes)})"
        if recipe == CONTROL and method != BASELINE_METHOD:
            return f"the {CONTROL} control runs {BASELINE_METHOD} only, not {method}"
        if recipe != CONTROL and method not in self.methods:
            return f"method {method} is not in the design"
        if seed not in self.seeds:
            return f"seed {seed} is not in the design ({', '.join(map(str, self.seeds))})"
        if digest is None or n_per_split is None:
            return "the run carries no design tags (it predates them)"
        if n_per_split != str(self.n_per_split):
            return f"n_per_split {n_per_split}, not {self.n_per_split}"
        if digest != self.digest:
            return f"design digest {digest}, not {self.digest} (other corpus, queries, model or agent params)"
        return None

    def describe(self) -> str:
        """One line naming the design, for the report's header."""
        p = f"{PARAMETRIC} ({', '.join(self.p_recipes)})" if self.p_recipes else None
        substrates = ", ".join(s for s in (p, *self.substrates) if s)
        return (
            f"base model {self.base_model}; substrates {substrates} (with the {CONTROL} control on "
            f"each adapter-free one); methods {', '.join(self.methods)}; seeds "
            f"{', '.join(map(str, self.seeds))}; n = {self.n_per_split} queries per split and seed; "
            f"design digest {self.digest}"
        )
