"""`o3` (Gao et al. 2024; docs/definitions.md, "Methods"): architectural gating. A second, "unlearn" LoRA is trained
on top of the P target (kept frozen) toward a ReAct refusal on the forget prompts, with an
orthogonality penalty that keeps its A matrices' rows orthogonal to LoRA-T+D's; at inference a
detector switches the unlearn LoRA on for queries it takes to target the forget set and
leaves the target alone otherwise.

Detector: the oracle (ground-truth forget membership) with a configurable accuracy: each
query's decision is flipped when a uniform draw seeded by (detector_seed, query id) falls
below 1 - detector_accuracy, so a fraction 1 - accuracy of decisions is wrong whatever the
batch. `o3-90` and `o3-75` deploy the same trained weights at accuracy 0.9 and 0.75 (the
paper's §5.6 sweep), each its own leaderboard row.

Departures: the penalty is the mean squared cosine between the two adapters' A rows (scale
free; the paper's Frobenius norm of A_u A_t^T grows with the weights' scale), and there is no
retain term (the gate is what protects retain queries; retain_weight 0).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import Field
from safetensors.torch import load_file

from kbench.backends import Backend
from kbench.methods.base import Method, MethodConfig, MethodError, register_method
from kbench.methods.residual import unwrap
from kbench.methods.unlearning import P_ONLY, UnlearnConfig, WeightMethod
from kbench.methods.unlearning import ALTERNATE_SET, StepLoss, Unlearned, UnlearnStep
from kbench.records import FORGET, Query

_A, _B = ".lora_A.weight", ".lora_B.weight"


class O3GateConfig(MethodConfig):
    """The detector, all that an accuracy variant sets."""

    #: Share of the detector's decisions that are right (1.0: the oracle).
    detector_accuracy: float = Field(1.0, ge=0, le=1)
    detector_seed: int = 0


class O3Config(UnlearnConfig, O3GateConfig):
    retain_weight: float = Field(0.0, ge=0)
    #: The declared exception (`budget_exceptions`): a fresh adapter needs a larger rate in 5 steps.
    budget: dict[str, Any] = {"learning_rate": 0.01}
    #: Weight of the orthogonality penalty against LoRA-T+D's A matrices.
    orthogonality: float = Field(1.0, ge=0)


def _module(key: str) -> str:
    """`base_model.model.model.layers.0.mlp.up_proj.lora_A.weight` -> `model.layers.0.mlp.up_proj`."""
    return key.removeprefix("base_model.model.").rsplit(".lora_", 1)[0]


def detector_flip(seed: int, query_id: str, accuracy: float) -> bool:
    """Whether the detector gets this query wrong: a uniform draw in [0, 1) fixed by
    (seed, query id) below 1 - accuracy."""
    digest = hashlib.sha256(f"{seed}:{query_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < 1.0 - accuracy


def read_lora(folder: Path) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], float]:
    """A peft LoRA folder's (A, B) per module name and its scaling alpha / r."""
    from peft.utils import CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME

    config = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8"))
    tensors = load_file(str(folder / SAFETENSORS_WEIGHTS_NAME))
    pairs = {_module(k): (tensors[k], tensors[k.replace(_A, _B)]) for k in sorted(tensors) if k.endswith(_A)}
    return pairs, float(config["lora_alpha"]) / float(config["r"])


@register_method("o3", substrates=P_ONLY, hooks=frozenset({"forward"}),
                 family="architectural gating", order=170)
class O3(WeightMethod):
    """A second LoRA toward a refusal, switched on by a forget-query detector (the oracle)."""

    Config: ClassVar[type[MethodConfig]] = O3Config
    needs_alternates = True
    own_adapter = True
    budget_exceptions = {
        "learning_rate": "a fresh adapter, trained from zero",
    }
    config: O3Config
    edit_weights = Method.edit_weights  # nothing to load into the weights: the hook applies the unlearn LoRA

    # -- training --------------------------------------------------------------------------
    def begin(self, model: Any, target_adapter: Any) -> None:
        target, _ = read_lora(Path(target_adapter))
        self._target_rows = {name: torch.nn.functional.normalize(a.double(), dim=-1) for name, (a, _) in target.items()}
        self._trainable_a = {
            _module(name.replace(".default", "")): p
            for name, p in model.named_parameters() if p.requires_grad and ".lora_A." in name
        }
        missing = sorted(set(self._trainable_a) - set(self._target_rows))
        if missing:
            raise MethodError(f"o3: LoRA-T+D has no adapter on {missing[0]} to be orthogonal to")

    def orthogonality_penalty(self) -> torch.Tensor:
        """Mean squared cosine between the unlearn adapter's A rows and LoRA-T+D's."""
        terms = []
        for name, a in self._trainable_a.items():
            rows = torch.nn.functional.normalize(a, dim=-1)
            terms.append((rows @ self._target_rows[name].to(rows).T).pow(2).mean())
        return torch.stack(terms).mean()

    def unlearning_loss(self, step: UnlearnStep) -> StepLoss:
        refusal = step.policy(ALTERNATE_SET).mean_nll()
        return StepLoss(forget=self.forget_term(refusal) + self.config.orthogonality * self.orthogonality_penalty())

    # -- the gate --------------------------------------------------------------------------
    def gate(self, query: Query) -> bool:
        """True when the detector switches the unlearn LoRA on for this query."""
        member = self.context.corpus.split_of(query.entity_id) == FORGET
        flip = detector_flip(self.config.detector_seed, query.query_id, self.config.detector_accuracy)
        return member != flip

    def load_unlearned(self, unlearned: Unlearned) -> None:
        super().load_unlearned(unlearned)
        self._lora, self._scale = read_lora(Path(unlearned.path))

    @contextmanager
    def forward_hooks(self, backend: Backend, queries: Sequence[Query]) -> Iterator[None]:
        if self.unlearned is None:
            raise MethodError("o3 deploys the unlearn LoRA of the `unlearn` stage; none was loaded")
        gates = [self.gate(q) for q in queries]
        root = unwrap(backend.model)
        handles = []
        for name, (a, b) in self._lora.items():
            def hook(module: Any, args: Any, output: torch.Tensor, a: torch.Tensor = a, b: torch.Tensor = b) -> torch.Tensor:
                rows = backend.batch_rows
                rows = range(output.shape[0]) if rows is None else rows
                on = torch.tensor([gates[i] for i in rows], dtype=torch.bool)
                if len(on) != output.shape[0]:
                    raise MethodError("o3: a forward pass whose rows are not the batch's queries (shared prefix)")
                if not on.any():
                    return output
                x = args[0][on]
                delta = (x @ a.to(x).T) @ b.to(x).T * self._scale
                edited = output.clone()
                edited[on] += delta
                return edited

            handles.append(root.get_submodule(name).register_forward_hook(hook))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


class O3At90Config(O3GateConfig):
    detector_accuracy: float = Field(0.9, ge=0, le=1)


class O3At75Config(O3GateConfig):
    detector_accuracy: float = Field(0.75, ge=0, le=1)


@register_method("o3-90", substrates=P_ONLY, hooks=frozenset({"forward"}),
                 family="architectural gating", order=180)
class O3At90(O3):
    """O3's weights behind a detector right on 90% of queries."""

    Config: ClassVar[type[MethodConfig]] = O3At90Config
    weights_of = "o3"


@register_method("o3-75", substrates=P_ONLY, hooks=frozenset({"forward"}),
                 family="architectural gating", order=190)
class O3At75(O3):
    """O3's weights behind a detector right on 75% of queries."""

    Config: ClassVar[type[MethodConfig]] = O3At75Config
    weights_of = "o3"
