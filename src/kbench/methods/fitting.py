"""What a method fits itself on: ReAct prompts about the adapter-pool entities
(docs/definitions.md, "Corpus and splits"; docs/definitions.md, "Methods").

The fit stage (`kbench fit`, `kbench.stages.fit.fit_prompts`) builds one `FitData` per base
model and hands it to every method that fits. Its prompts are the agent's ReAct prompt (system prompt, tool list, the question
turn) for every field of every entity of the two adapter pools: forget-adapter entities are
label 1, retain-adapter entities label 0. No evaluation entity is ever read.

`activations(layer)` is the residual stream at a decoder layer's output over the question
turn (the tokens after the prompt prefix every fit prompt shares), read once for all layers
in one pass: the shared prefix is run once and its cache reused by every prompt.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from kbench import io
from kbench.backends import Conversation
from kbench.backends.engine import common_prefix
from kbench.backends.hf import encode_prompt
from kbench.config import Params
from kbench.corpus import Corpus
from kbench.methods.base import Fitted, MethodError, method_config
from kbench.methods.residual import decoder_layers, residual_capture

log = logging.getLogger(__name__)

#: The pools fitting reads, with their labels (forget = 1).
FIT_POOLS = {"forget_adapter": 1, "retain_adapter": 0}


@dataclass(frozen=True)
class FitPrompt:
    """One fit prompt: the agent's ReAct prompt for one field of one adapter-pool entity."""

    #: The entity asked about (always in an adapter pool).
    entity_id: str
    #: The field asked for.
    field: str
    #: 1 for a forget-adapter entity, 0 for a retain-adapter entity.
    label: int
    #: The question as the agent sees it.
    question: str
    #: The ReAct conversation the agent would start from (no background: the R and P form).
    conversation: Conversation


def name_positions(tokenizer: Any, ids: Sequence[int], name: str) -> list[int]:
    """Indices of the tokens of `ids` whose text overlaps an occurrence of `name`."""
    pieces = [tokenizer.decode([t]) for t in ids]
    ends = np.cumsum([len(p) for p in pieces])
    text = "".join(pieces)
    found: set[int] = set()
    start = text.find(name)
    while start != -1:
        stop = start + len(name)
        first = int(np.searchsorted(ends, start, side="right"))
        last = int(np.searchsorted(ends, stop - 1, side="right"))
        found.update(range(first, last + 1))
        start = text.find(name, stop)
    return sorted(found)


@dataclass(frozen=True)
class Activations:
    """The residual stream at one layer over every fit prompt's question turn, token by token."""

    #: (tokens, hidden) float32 activations.
    x: torch.Tensor
    #: (tokens,) the label of each token's prompt (1 forget, 0 retain).
    label: torch.Tensor
    #: (tokens,) index of each token's prompt in `FitData.prompts`.
    prompt: torch.Tensor


class FitData:
    """The adapter-pool prompts and the base model's activations on them (read lazily, once)."""

    def __init__(self, load: Callable[[], tuple[Any, Any]], corpus: Corpus, params: Params, prompts: list[FitPrompt]) -> None:
        """`load()` gives (model, tokenizer), called the first time a method reads them (a method
        that needs no weights, StaR, fits without a model)."""
        if not prompts or len({p.label for p in prompts}) < 2:
            raise ValueError("fitting needs prompts of both adapter pools (forget and retain)")
        self._load = load
        self._heldout: dict[int, float] = {}
        self.corpus = corpus
        self.params = params
        self.prompts = prompts
        self.batch_size = params.fit.batch_size

    @cached_property
    def _weights(self) -> tuple[Any, Any]:
        return self._load()

    @property
    def model(self) -> Any:
        return self._weights[0]

    @property
    def tokenizer(self) -> Any:
        return self._weights[1]

    @property
    def labels(self) -> np.ndarray:
        return np.array([p.label for p in self.prompts])

    @property
    def n_layers(self) -> int:
        return len(decoder_layers(self.model))

    def activations(self, layer: int) -> Activations:
        return self._all_layers[layer]

    @cached_property
    def _all_layers(self) -> dict[int, Activations]:
        ids = [encode_prompt(self.tokenizer, p.conversation) for p in self.prompts]
        shared = min(min(common_prefix(ids[0], other) for other in ids), min(len(i) for i in ids) - 1)
        layers = list(range(self.n_layers))
        device = next(self.model.parameters()).device
        sink: dict[int, list[torch.Tensor]] = {}
        kept: list[tuple[int, int]] = []  # (prompt, tokens) in the order rows were read
        with torch.inference_mode():
            prefix = DynamicCache()
            self.model(input_ids=torch.tensor([ids[0][:shared]], device=device), cache=prefix, use_cache=True)
            keys = [(layer.keys, layer.values) for layer in prefix.layers]
            for start in range(0, len(ids), self.batch_size):
                rows = list(range(start, min(start + self.batch_size, len(ids))))
                tails = [ids[i][shared:] for i in rows]
                width = max(len(t) for t in tails)
                batch = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long, device=device)
                mask = torch.zeros(len(rows), shared + width, dtype=torch.long, device=device)
                mask[:, :shared] = 1
                for j, tail in enumerate(tails):  # right-padded: a real token never sees a pad
                    batch[j, : len(tail)] = torch.tensor(tail, device=device)
                    mask[j, shared : shared + len(tail)] = 1
                    kept.append((rows[j], self._first_name_token(rows[j], ids[rows[j]][shared:]), len(tail)))
                cache = DynamicCache()
                for index, (k, v) in enumerate(keys):
                    cache.update(k.expand(len(rows), -1, -1, -1).clone(), v.expand(len(rows), -1, -1, -1).clone(), index)
                positions = (shared + torch.arange(width, device=device)).expand(len(rows), -1)
                with residual_capture(self.model, layers, sink):
                    self.model(input_ids=batch, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        label = torch.tensor([self.prompts[i].label for i, first, n in kept for _ in range(first, n)])
        prompt = torch.tensor([i for i, first, n in kept for _ in range(first, n)])
        result = {}
        for layer in layers:
            read = [h[j] for h in sink[layer] for j in range(h.shape[0])]
            x = torch.cat([read[r][first:n] for r, (_, first, n) in enumerate(kept)]).float()
            result[layer] = Activations(x=x, label=label, prompt=prompt)
        log.info("fit: read %d question-turn tokens of %d prompts at %d layers (shared prefix %d tokens)",
                 len(label), len(self.prompts), len(layers), shared)
        return result

    def _first_name_token(self, index: int, turn: list[int]) -> int:
        """Offset, in the question turn, of the entity name's first token (the concept can only
        be read from there on); 0 if the name is not found."""
        found = name_positions(self.tokenizer, turn, self.corpus.entities[self.prompts[index].entity_id].name)
        return found[0] if found else 0

    def heldout_field(self) -> str:
        """The field whose prompts are held out from probe training (the last of queries.fields)."""
        return self.params.queries.fields[-1]

    def heldout_accuracy(self, layer: int) -> float:
        """Held-out linear-probe accuracy of forget-vs-retain on the unedited activations at
        `layer` (computed once: the layer scan and every activation method's "before" share it)."""
        if layer not in self._heldout:
            acts = self.activations(layer)
            train, held = self.split(acts)
            self._heldout[layer] = probe_accuracy(acts.x[train], acts.label[train], acts.x[held], acts.label[held])
        return self._heldout[layer]

    def split(self, acts: Activations) -> tuple[torch.Tensor, torch.Tensor]:
        """Boolean masks (train, held-out) over `acts` tokens: held-out = prompts of `heldout_field`."""
        heldout = torch.tensor([self.prompts[i].field == self.heldout_field() for i in acts.prompt.tolist()])
        return ~heldout, heldout


def layer_scan(data: FitData) -> dict[str, float]:
    """Held-out probe accuracy of the concept at every layer (how the default layers were chosen)."""
    return {str(layer): data.heldout_accuracy(layer) for layer in range(data.n_layers)}


def probe_accuracy(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                   *, seed: int = 0) -> float:
    """Held-out accuracy of a logistic-regression probe (the linear-decodability check)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    # standardized: a few residual dimensions are two orders of magnitude larger than the rest
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000, random_state=seed))
    probe.fit(train_x.double().numpy(), train_y.numpy())
    return float(probe.score(test_x.double().numpy(), test_y.numpy()))


# -- the fitted artifact: artifacts/fitted/<method>/ -------------------------------------------
FITTED_FILE = "fitted.safetensors"
DIAGNOSTICS_FILE = "diagnostics.json"
#: What the artifact was fitted for: the method, its params section, the base model's fingerprint.
FIT_INFO_FILE = "fit.json"


def fitted_dir(params: Params, method: str) -> Path:
    return Path(params.fit.out_dir) / method


def save_fitted(folder: Path, fitted: Fitted, info: dict[str, Any]) -> None:
    """Write the artifact atomically, with its hashes (checked by every cell that loads it)."""
    from safetensors.torch import save_file

    with io.atomic_dir(folder) as partial:
        save_file({k: v.detach().contiguous().cpu() for k, v in fitted.tensors.items()}, str(partial / FITTED_FILE))
        io.write_json(partial / DIAGNOSTICS_FILE, fitted.diagnostics)
        io.write_json(partial / FIT_INFO_FILE, info)
        io.write_hashes(partial)


def load_fitted(params: Params, method: str, base_fingerprint: str) -> Fitted:
    """The method's fitted artifact, refused if missing, altered, or fitted for another base
    model or other `method_params` (each case names what to rerun)."""
    from safetensors.torch import load_file

    folder = fitted_dir(params, method)
    config = method_config(method, params).model_dump(mode="json")
    if not (folder / FIT_INFO_FILE).is_file():
        raise MethodError(f"method {method!r} has no fitted artifact at {folder}: run `kbench fit` "
                          "(DVC stage `fit`) first")
    io.verify_hashes(folder, "fitted artifact")
    info = json.loads((folder / FIT_INFO_FILE).read_text(encoding="utf-8"))  # hashes verified above
    if info.get("base_fingerprint") != base_fingerprint:
        raise MethodError(
            f"{folder} was fitted for base model {info.get('base_model')!r} (fingerprint "
            f"{info.get('base_fingerprint')}); this cell runs fingerprint {base_fingerprint}: rerun `kbench fit`"
        )
    if info.get("config") != config:
        raise MethodError(f"{folder} was fitted with method_params.{method} = {info.get('config')}; "
                          f"params now say {config}: rerun `kbench fit`")
    tensors = load_file(str(folder / FITTED_FILE))
    return Fitted(tensors=tensors, diagnostics=json.loads((folder / DIAGNOSTICS_FILE).read_text(encoding="utf-8")))
