"""llama.cpp's OpenAI-compatible server (`python -m llama_cpp.server`) on 127.0.0.1.

A transformers model folder is converted to GGUF by llama.cpp's own converter, the
`convert_hf_to_gguf.py` of the llama-cpp-python release installed (`make setup` unpacks it,
`convert_lora_to_gguf.py` for peft adapters and its `gguf-py` from the same source archive into
`<venv>/share/llama.cpp`, so converters and engine come from one llama.cpp version). Float32 by
default: the model's own weights, unquantized.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kbench.servers import answers, free_port, server_process

log = logging.getLogger(__name__)

#: Where `make setup` unpacks llama.cpp's converter (beside the installed engine).
SHARE = Path(sys.prefix) / "share" / "llama.cpp"
_SETUP_HINT = "run `make setup` (it builds llama-cpp-python and unpacks its converter)"


class ServingError(OSError):
    """A model that cannot be converted, or a server that does not start or answer."""


#: llama.cpp's converters: a model folder to GGUF, a peft LoRA adapter to a GGUF LoRA.
MODEL_CONVERTER, LORA_CONVERTER = "convert_hf_to_gguf.py", "convert_lora_to_gguf.py"


def converter_script(name: str = MODEL_CONVERTER) -> Path:
    """One of llama.cpp's converters of the installed release."""
    script = SHARE / name
    if not script.is_file():
        raise ServingError(f"llama.cpp's converter is not at {script}: {_SETUP_HINT}")
    return script


def _convert(script: str, source: str | Path, out: str | Path, outtype: str, *extra: str) -> Path:
    """Run converter `script` on `source` into `out` (written atomically)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SHARE / "gguf-py"), str(SHARE)]), "NO_LOCAL_GGUF": ""}
    done = subprocess.run([sys.executable, str(converter_script(script)), *extra, str(source), "--outfile",
                           str(partial), "--outtype", outtype], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ServingError(f"cannot convert {source} to GGUF: {tail[0]}")
    partial.replace(out)
    return out


def to_gguf(model_dir: str | Path, out: str | Path, *, outtype: str = "f32") -> Path:
    """`model_dir` (a transformers folder) as one GGUF file at `out` (written atomically)."""
    return _convert(MODEL_CONVERTER, model_dir, out, outtype)


def lora_to_gguf(adapter_dir: str | Path, base_dir: str | Path, out: str | Path, *, outtype: str = "f32") -> Path:
    """The peft LoRA adapter in `adapter_dir`, trained on the transformers folder `base_dir`, as a
    GGUF LoRA at `out` (written atomically), which llama.cpp applies unmerged at load."""
    return _convert(LORA_CONVERTER, adapter_dir, out, outtype, "--base", str(base_dir))


def check_endpoint(base_url: str) -> None:
    """An OpenAI-compatible endpoint answers `GET <base_url>/models`, or one clear error."""
    if not answers(f"{base_url.rstrip('/')}/models"):
        raise ServingError(f"the endpoint {base_url} does not answer (GET {base_url.rstrip('/')}/models)")


@contextmanager
def llama_server(gguf: str | Path, *, alias: str, threads: int, n_ctx: int = 8192, trained_ctx: int | None = None,
                 chat_format: str | None = None, lora: str | Path | None = None,
                 startup_timeout: float = 180.0) -> Iterator[str]:
    """Serve `gguf` as model `alias` on 127.0.0.1 (a free port); yields the API root
    (`http://127.0.0.1:<port>/v1`) and stops the server on exit. `n_ctx` 0 is the model's trained
    context; one beyond the model's `trained_ctx` positions is reached with YaRN RoPE scaling.
    `chat_format` names one of llama-cpp-python's chat formats (None: the GGUF's own template);
    `lora`, a GGUF LoRA (`lora_to_gguf`) the server applies to every request."""
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError:
        raise ServingError(f"llama-cpp-python[server] is not installed: {_SETUP_HINT}") from None
    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", alias,
               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(threads),
               "--n_threads_batch", str(threads), "--seed", "0", "--verbose", "False"]
    if chat_format:
        command += ["--chat_format", chat_format]
    if lora:
        command += ["--lora_path", str(lora)]
    if trained_ctx and n_ctx > trained_ctx:
        command += ["--rope_scaling_type", "2", "--rope_freq_scale", str(trained_ctx / n_ctx),
                    "--yarn_orig_ctx", str(trained_ctx)]  # 2: llama.cpp's YaRN
    log.info("starting llama.cpp's server on 127.0.0.1:%d (%s, %d threads)", port, Path(gguf).name, threads)
    with server_process(command, f"{base}/models", name="llama.cpp's server", error=ServingError,
                        startup_timeout=startup_timeout):
        yield base
    log.info("stopped llama.cpp's server on port %d", port)
