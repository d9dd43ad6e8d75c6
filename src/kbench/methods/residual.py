"""Where activation methods act: a decoder layer's output (the residual stream) and the input
embeddings, read or rewritten through forward hooks (shared by every method that needs them).

Every forward pass runs through the hooks, cached or not: the KV engine's prefill and decode
passes, transformers' `generate`, and the fit stage's reads. `HFBackend.batch_rows` tells a
hook which conversation each batch row is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from kbench.methods.base import MethodError

Edit = Callable[[torch.Tensor], torch.Tensor]


def unwrap(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (a P cell's unmerged adapter)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def decoder_layers(model: Any) -> Any:
    """The model's decoder layers, in order (Llama, Mistral, Qwen, Gemma: `model.layers`;
    GPT-2 style: `transformer.h`)."""
    inner = unwrap(model)
    for path in (("model", "layers"), ("transformer", "h"), ("gpt_neox", "layers")):
        node = inner
        for attribute in path:
            node = getattr(node, attribute, None)
        if node is not None:
            return node
    raise MethodError(f"cannot find the decoder layers of {type(inner).__name__}: activation methods "
                      "need a Llama-, GPT-2- or NeoX-style model")


def check_layer(model: Any, layer: int, method: str) -> int:
    """`layer` if the model has it; a MethodError naming the valid range otherwise."""
    count = len(decoder_layers(model))
    if not 0 <= layer < count:
        raise MethodError(f"method_params.{method}.layer: {layer} is not a decoder layer of this model "
                          f"(it has {count}: 0..{count - 1})")
    return layer


def _hidden(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


@contextmanager
def residual_edit(model: Any, layer: int, edit: Edit) -> Iterator[None]:
    """Replace decoder layer `layer`'s output h (rows, positions, hidden) with `edit(h)` at every
    forward pass inside the block."""

    def hook(module: Any, args: Any, output: Any) -> Any:
        edited = edit(_hidden(output))
        return (edited, *output[1:]) if isinstance(output, tuple) else edited

    handle = decoder_layers(model)[layer].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def residual_capture(model: Any, layers: list[int], sink: dict[int, list[torch.Tensor]]) -> Iterator[None]:
    """Append each forward pass's output of every layer in `layers` to `sink[layer]` (detached)."""
    handles = []
    modules = decoder_layers(model)
    for layer in layers:
        def hook(module: Any, args: Any, output: Any, layer: int = layer) -> None:
            sink.setdefault(layer, []).append(_hidden(output).detach())

        handles.append(modules[layer].register_forward_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def embedding_edit(model: Any, edit: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Replace the input embeddings e (rows, positions, hidden) of token ids (rows, positions)
    with `edit(ids, e)` at every forward pass inside the block."""

    def hook(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        return edit(args[0], output)

    handle = unwrap(model).get_input_embeddings().register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def mean_edit_norm(x: torch.Tensor, edit: Edit) -> float:
    """Mean per-token L2 norm of what `edit` changes on activations x (tokens, hidden)."""
    with torch.no_grad():
        return float((edit(x[None])[0] - x).norm(dim=-1).mean())
