"""`llama-cpp`: a local model served by llama.cpp's OpenAI-compatible server (`llama-cpp-python[server]`),
which the backend starts on 127.0.0.1 and then talks to exactly as the `openai` backend does.

`model.path` is a transformers folder (converted once per process to a float32 GGUF by
llama.cpp's own converter, `kbench.serving.to_gguf`) or a `.gguf` file, served as it is (a
quantized one, say). Every backend of one process over the same file shares one server,
started at its first request, on this process's compute threads; it is stopped when the
process ends, and by the kernel if the process is killed. The server keeps no weights this
process could edit: what the `openai` backend refuses (forward-hook methods, recipe merged,
the agent base) this one refuses too. A cell's LoRA adapter (substrate P, a weight method's,
LoRA-D) is converted to a GGUF LoRA and served, applied unmerged, by a server of its own under
the adapter's served name (`kbench.serving.adapters`); `model.path` must then be the
transformers folder it was trained on.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.util
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from kbench.backends.base import BackendError, Conversation, Generation, Request, register_backend
from kbench.backends.openai import OpenAIBackend
from kbench.config import ModelConfig
from kbench.serving import ServingError, llama_server, served_name, to_gguf
from kbench.serving.llama_cpp import lora_to_gguf

log = logging.getLogger(__name__)

#: The name the server gives its one model.
ALIAS = "kbench"
#: llama.cpp's own name for a GGUF without a chat template, by architecture (Gemma 3's base
#: model ships none; llama-cpp-python would otherwise fall back to Llama 2's).
_CHAT_FORMATS = {"gemma3": "gemma"}

_servers: dict[tuple, str] = {}
#: The GGUF file of each model folder or adapter this process converted, by resolved path.
_converted: dict[str, Path] = {}
_running = contextlib.ExitStack()


def stop_servers() -> None:
    """Stop every server this process started (what its exit does anyway)."""
    _running.close()
    _servers.clear()
    _converted.clear()


def _gguf_facts(gguf: Path) -> tuple[int | None, str | None]:
    """The trained context and, where the file has no chat template, the chat format to use."""
    from gguf import GGUFReader

    try:
        fields = GGUFReader(gguf).fields
    except (ValueError, OSError) as exc:
        raise BackendError(f"{gguf} is not a readable GGUF file: {exc}") from None

    def value(key: str):
        field = fields.get(key)
        return None if field is None else field.contents()

    arch = value("general.architecture")
    trained = value(f"{arch}.context_length")
    chat_format = None if value("tokenizer.chat_template") else _CHAT_FORMATS.get(arch)
    return (int(trained) if trained else None), chat_format


def _check_served(path: Path) -> None:
    """Refuse, before any server starts, a `path` that is neither a transformers folder nor a readable GGUF."""
    if path.is_file() and path.suffix == ".gguf":
        _gguf_facts(path)
    elif not (path / "config.json").is_file():
        raise BackendError(f"model.path {path} is neither a transformers model folder nor a .gguf file; "
                           "the llama-cpp backend serves one of them")


def _served_file(path: Path) -> Path:
    """`path` as a GGUF file: itself, or its folder converted into a scratch folder of the process."""
    _check_served(path)
    return path if path.suffix == ".gguf" else _converting(path, to_gguf)


def _converting(path: Path, convert, *args: Path) -> Path:
    """`path` converted once per process by `convert(path, *args, out)` into a scratch folder."""
    key = str(path.resolve())
    if key not in _converted:
        scratch = Path(_running.enter_context(tempfile.TemporaryDirectory(prefix="kbench-gguf-")))
        started = time.perf_counter()
        _converted[key] = convert(path, *args, scratch / f"{path.name}.gguf")
        log.info("converted %s to GGUF in %.0f s", path, time.perf_counter() - started)
    return _converted[key]


def serve(path: str | Path, threads: int, *, n_ctx: int | None = None, alias: str = ALIAS,
          lora: str | Path | None = None) -> str:
    """The API root of this process's llama.cpp server over `path` serving model `alias`, started
    on first use. `n_ctx` None is the model's trained context; a longer one is reached with YaRN.
    `lora`: a peft adapter folder trained on `path` (a transformers folder), applied unmerged."""
    key = (str(Path(path).resolve()), threads, n_ctx, alias, str(Path(lora).resolve()) if lora else None)
    if key not in _servers:
        if not _servers:  # runs at this process's exit, a pool worker's included (atexit does not)
            multiprocessing.util.Finalize(None, stop_servers, exitpriority=100)
        gguf = _served_file(Path(path))
        lora_gguf = None
        if lora is not None:
            if not (Path(path) / "config.json").is_file():
                raise BackendError(f"the llama-cpp backend applies LoRA adapter {lora} to the transformers folder "
                                   f"it was trained on; model.path {path} is a .gguf file")
            lora_gguf = _converting(Path(lora), lora_to_gguf, Path(path))
        trained, chat_format = _gguf_facts(gguf)
        _servers[key] = _running.enter_context(llama_server(
            gguf, alias=alias, threads=threads, n_ctx=n_ctx or trained or 0, trained_ctx=trained,
            chat_format=chat_format, lora=lora_gguf))
    return _servers[key]


@register_backend("llama-cpp")
class LlamaCppBackend(OpenAIBackend):
    has_weights = False
    remote = False

    def __init__(self, config: ModelConfig) -> None:
        if config.base_url:
            raise BackendError("the llama-cpp backend starts its own server: leave model.base_url unset "
                               "(the openai backend talks to a server already running)")
        _check_served(Path(config.path))
        self.config = config
        self._client = None

    def start(self) -> None:
        """Start the base model's server now, if no server is in use yet (a benchmark times the
        requests, not the conversion and start)."""
        if self._client is None:
            self._connect(self.config, self._started(), ALIAS, "local")

    def _generate(self, conversations: Sequence[Conversation], request: Request) -> list[Generation]:
        """The base model's server starts on the first request: a cell that loads an adapter first
        (substrate P, LoRA-D, a weight method) only ever talks to the adapter's server."""
        self.start()
        return super()._generate(conversations, request)

    def _started(self, **adapter: str) -> str:
        """The API root of the process's server over model.path (with `lora`, applied unmerged)."""
        try:
            return serve(self.config.path, torch.get_num_threads(), **adapter)
        except ServingError as exc:
            raise BackendError(str(exc)) from None

    def _serve_adapter(self, path: str) -> str:
        """A server of its own applies the adapter, under the name an endpoint would serve it."""
        name = served_name(path)
        self._connect(self.config, self._started(alias=name, lora=path), name, "local")
        return name
