"""Serving engines the project starts itself: llama.cpp's OpenAI-compatible server
(`llama-cpp-python[server]`) over a model folder converted to GGUF once. A server binds
127.0.0.1 on a free port and is stopped by whoever started it (`llama_server` is a context
manager). And the names LoRA adapters are served under by a server the user starts (vLLM's
`--lora-modules`, `kbench.serving.adapters`). Every name below is importable from
`kbench.serving` directly."""

from kbench.serving.adapters import served_name, vllm_flags
from kbench.serving.llama_cpp import ServingError, check_endpoint, converter_script, llama_server, to_gguf

__all__ = ["ServingError", "check_endpoint", "converter_script", "llama_server", "served_name", "to_gguf",
           "vllm_flags"]
