"""The shared base of the weight methods on P (GA, GD, NPO, ...): a loss the one unlearning
trainer (`kbench.parametric.unlearning`) applies to the P target under the matched budget.

A weight method is one module with one registered `WeightMethod` subclass: its `Config` (the
loss's weights and constants, `method_params.<name>`) and `unlearning_loss(step)`. The
`unlearn` stage trains it once per P recipe; its cells load the result (`load_unlearned`):
an adapter that replaces LoRA-T+D (recipe lora) or one stacked on the merged weights (recipe
merged, applied by `edit_weights`).

The budget (epochs, batch, optimizer, schedule) is the `unlearning` section, the same for
every method. A method that must differ names the keys in `budget_exceptions` with the reason
and sets them in its section's `budget`; any other override is refused (`method_budget`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import Field

from kbench.backends import Backend
from kbench.config import Params, ParamsError, UnlearningConfig
from kbench.methods.base import Method, MethodConfig, MethodError, method_class, method_config
from kbench.names import PARAMETRIC

if TYPE_CHECKING:
    from kbench.parametric.lora import Example

#: The example sets a step can score: the forget and retain records, and each forget record's
#: prompt with a refusal answer (for methods that ask for it).
FORGET_SET, RETAIN_SET, ALTERNATE_SET = "forget", "retain", "alternate"

@dataclass(frozen=True)
class Scored:
    """One packed pass over a batch of examples: what a loss reads, token by token."""

    #: (tokens, vocabulary) logits that predict each learned token, float32 or wider.
    logits: torch.Tensor
    #: (tokens,) the learned token ids.
    targets: torch.Tensor
    #: (tokens,) the index in the batch of the example each token belongs to.
    owners: torch.Tensor
    #: Examples in the batch.
    n_examples: int
    #: (tokens, hidden) a decoder layer's output at the nodes predicting each token, when asked.
    hidden: torch.Tensor | None = None

    def token_nll(self) -> torch.Tensor:
        """(tokens,) next-token cross-entropy."""
        return -torch.log_softmax(self.logits, -1).gather(-1, self.targets[:, None])[:, 0]

    def example_sum(self, values: torch.Tensor) -> torch.Tensor:
        """(examples,) per-token `values` summed per example."""
        out = torch.zeros(self.n_examples, dtype=values.dtype, device=values.device)
        return out.index_add(0, self.owners, values)

    def example_nll(self) -> torch.Tensor:
        """(examples,) summed answer NLL per example (OpenUnlearning's `compute_batch_nll`)."""
        return self.example_sum(self.token_nll())

    def example_lengths(self) -> torch.Tensor:
        """(examples,) learned tokens per example."""
        return self.example_sum(torch.ones_like(self.targets, dtype=self.logits.dtype))

    def mean_nll(self) -> torch.Tensor:
        """Mean next-token cross-entropy over every learned token of the batch."""
        return self.token_nll().mean()


class UnlearnStep:
    """One optimizer step as a method's loss sees it: scored passes on demand, each made once
    (the trainer, `kbench.parametric.unlearning`, builds it with its packed scorer).

    `policy(set)` is the model being trained (with the gradient); `reference(set)` is the
    target before unlearning (no gradient). `set` is FORGET_SET, RETAIN_SET or ALTERNATE_SET
    (the forget prompts with a refusal answer, for methods that ask for it).
    """

    def __init__(self, model: Any, batches: dict[str, list[Example]], swap: Callable[[], Any],
                 scorer: Callable[[list[Example]], Scored], *,
                 reference_cache: dict[Any, Scored] | None = None, keys: dict[str, Any] | None = None) -> None:
        self.model = model
        self._batches = batches
        self._swap = swap
        self._scorer = scorer
        self._cache: dict[tuple[str, bool], Scored] = {}
        # Reference passes shared across runs from the same starting weights (the same batches
        # give the same passes): `keys[which]` names the batch in `reference_cache`.
        self._shared = reference_cache
        self._keys = keys or {}

    def has(self, which: str) -> bool:
        """Whether this step has a `which` batch (no retain batch when the retain set is empty)."""
        return which in self._batches

    def examples(self, which: str) -> list[Example]:
        if which not in self._batches:
            raise UnlearningError(f"this run has no {which} examples")
        return self._batches[which]

    def policy(self, which: str) -> Scored:
        key = (which, False)
        if key not in self._cache:
            self._cache[key] = self._scorer(self.examples(which))
        return self._cache[key]

    def reference(self, which: str) -> Scored:
        key = (which, True)
        if key not in self._cache:
            shared = self._keys.get(which) if self._shared is not None else None
            if shared is not None and shared in self._shared:
                self._cache[key] = self._shared[shared]
            else:
                with torch.no_grad(), self._swap():
                    self._cache[key] = self._scorer(self.examples(which))
                if shared is not None:
                    self._shared[shared] = self._cache[key]
        return self._cache[key]

    def scored_policy(self, which: str) -> Scored | None:
        """The policy pass of `which` if the loss made one (for the logged NLLs)."""
        return self._cache.get((which, False))


@dataclass(frozen=True)
class StepLoss:
    """A method's loss at one step: its forget term and its retain term (weights applied)."""

    forget: torch.Tensor
    retain: torch.Tensor | float = 0.0

    @property
    def total(self) -> torch.Tensor:
        return self.forget + self.retain


#: How an unlearned folder's adapter is applied at a cell: it replaces LoRA-T+D (recipe lora),
#: or it sits on top of the target's weights (recipe merged, and O3's second adapter).
CONTINUED, STACKED = "continued", "stacked"
#: The block of injection.json an unlearned folder adds (method, recipe, budget, curves).
UNLEARNING_KEY = "unlearning"


@dataclass(frozen=True)
class Unlearned:
    """A checked unlearned folder, as a cell loads it."""

    path: Path
    #: CONTINUED or STACKED.
    kind: str
    #: The registered method whose loss trained it.
    method: str
    recipe: str
    #: The run's record from injection.json: budget, exceptions, the target it started from, curves.
    info: dict



#: The one substrate weight methods act on.
P_ONLY: frozenset[str] = frozenset({PARAMETRIC})


class UnlearnConfig(MethodConfig):
    """What every weight method's section holds besides its loss's own constants."""

    #: Weight of the forget term (OpenUnlearning's gamma).
    forget_weight: float = Field(1.0, ge=0)
    #: Weight of the retain term (OpenUnlearning's alpha); 0 drops it.
    retain_weight: float = Field(1.0, ge=0)
    #: Overrides of `unlearning` keys; only the keys the method declares in `budget_exceptions`.
    budget: dict[str, Any] = {}


class WeightMethod(Method):
    """A loss on P's weights; not registered (a base class). Subclasses register with
    `hooks=frozenset({"weights"})` and implement `unlearning_loss`."""

    Config: ClassVar[type[MethodConfig]] = UnlearnConfig
    trains = True
    #: Budget keys this method may set differently, each with the reason (shown in the report).
    budget_exceptions: ClassVar[dict[str, str]] = {}
    #: True: the trainer also hands it the forget prompts with a refusal answer (ALTERNATE_SET).
    needs_alternates: ClassVar[bool] = False
    #: True: it always trains a fresh LoRA on top of the target, never LoRA-T+D itself (O3).
    own_adapter: ClassVar[bool] = False
    config: UnlearnConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unlearned: Unlearned | None = None

    # -- training --------------------------------------------------------------------------
    def hidden_layer(self) -> int | None:
        """A decoder layer whose output every scored pass returns (RMU), or None."""
        return None

    def begin(self, model: Any, target_adapter: Any) -> None:
        """Called once before training with the model and LoRA-T+D's folder (O3 reads its A matrices)."""

    def unlearning_loss(self, step: UnlearnStep) -> StepLoss:
        raise NotImplementedError

    def forget_term(self, value: torch.Tensor) -> torch.Tensor:
        return self.config.forget_weight * value

    def retain_nll(self, step: UnlearnStep) -> torch.Tensor | float:
        """retain_weight x the mean answer NLL of the retain batch (OpenUnlearning's retain NLL)."""
        if not self.config.retain_weight or not step.has(RETAIN_SET):
            return 0.0
        return self.config.retain_weight * step.policy(RETAIN_SET).mean_nll()

    def retain_kl(self, step: UnlearnStep) -> torch.Tensor | float:
        """retain_weight x KL(reference || model) per retain answer token (a KL retain term)."""
        if not self.config.retain_weight or not step.has(RETAIN_SET):
            return 0.0
        policy = torch.log_softmax(step.policy(RETAIN_SET).logits, -1)
        reference = torch.log_softmax(step.reference(RETAIN_SET).logits, -1)
        kl = (reference.exp() * (reference - policy)).sum(-1)
        return self.config.retain_weight * kl.mean()

    # -- deployment ------------------------------------------------------------------------
    @classmethod
    def runs_without_weights(cls, serves_adapters: bool) -> bool:
        """On recipe lora its weights are one adapter in place of LoRA-T+D, which a server that
        applies adapters by name can serve; a second adapter of its own (O3) or a hook cannot."""
        return serves_adapters and cls.hooks <= {"weights"} and not cls.own_adapter

    def load_unlearned(self, unlearned: Unlearned) -> None:
        """Take the checked unlearned folder before the cell runs."""
        self.unlearned = unlearned

    def edit_weights(self, backend: Backend) -> None:
        """Recipe merged: stack the unlearned LoRA on the merged target (recipe lora: the cell
        already loaded it in place of LoRA-T+D)."""
        if self.unlearned is None:
            raise MethodError(f"method {self.name!r} deploys weights from the `unlearn` stage; none were loaded")
        if self.unlearned.kind == STACKED:
            backend.load_adapter(str(self.unlearned.path), merge=True)


def method_budget(name: str, params: Params) -> tuple[UnlearningConfig, dict[str, str]]:
    """The budget `name` trains under and its declared exceptions ({key: reason}); an override
    the method does not declare is a ParamsError naming the key."""
    cls = method_class(name)
    config = method_config(name, params)
    overrides = dict(getattr(config, "budget", {}) or {})
    declared = getattr(cls, "budget_exceptions", {})
    for key in overrides:
        if key not in UnlearningConfig.model_fields or key in {"out_dir", "lora"}:
            raise ParamsError(f"params: method_params.{name}.budget.{key}: not a budget key of `unlearning`")
        if key not in declared:
            raise ParamsError(
                f"params: method_params.{name}.budget.{key} differs from the matched budget (unlearning.{key}) "
                f"but method {name!r} declares no exception for it (WeightMethod.budget_exceptions)"
            )
    budget = UnlearningConfig.model_validate({**params.unlearning.model_dump(), **overrides})
    return budget, {key: declared[key] for key in overrides}


# -- refusal answers (IDK's preferred answers, O3's target) ------------------------------------
#: Refusals the project generates for a plain question about a person ({name}).
REFUSALS: tuple[str, ...] = (
    "I'm sorry, but I don't have any information about {name}.",
    "I don't know who {name} is.",
    "I can't help with that: I have no information about {name}.",
    "I'm not able to share anything about {name}; I don't know them.",
    "I have no record of {name}, so I can't answer.",
    "I don't know anything about {name}.",
    "Sorry, {name} is not someone I know about.",
    "I'm afraid I can't tell you anything about {name}.",
)
#: The ReAct form: a thought and a final answer that refuses.
REACT_REFUSAL = "Thought: I do not know anything about {name}.\nFinal Answer: I don't know."


def refusal_chat(chat: list[dict], name: str, react: bool, index: int) -> list[dict]:
    """`chat` with its last (assistant) turn replaced by a refusal: the ReAct form for an agent
    prompt, else one of REFUSALS chosen by `index` and the name (fixed, not random)."""
    if react:
        answer = REACT_REFUSAL.format(name=name)
    else:
        answer = REFUSALS[zlib.crc32(f"{name}:{index}".encode()) % len(REFUSALS)].format(name=name)
    return [*chat[:-1], {"role": "assistant", "content": answer}]
