"""`openai`: any OpenAI-compatible chat endpoint (vLLM, TGI, llama.cpp, `transformers serve`, a hosted API).

The API key is read from the environment variable named by `model.api_key_env`, so it never
appears in params, logs or MLflow. A batch is sent as concurrent requests. Endpoints that
return reasoning text beside the reply (`reasoning_content` in vLLM, `reasoning` elsewhere)
have it passed on so the harness records it as thoughts. A server that applies LoRA adapters
by name (vLLM's `--enable-lora --lora-modules`) serves substrate P: a cell's adapter is the
model name its requests ask for (`kbench.serving.adapters`).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote, urlsplit, urlunsplit

from kbench.backends.base import (
    Backend,
    BackendError,
    Conversation,
    Generation,
    Request,
    register_backend,
    truncate_at_stop,
)
from kbench.config import ModelConfig, redact_url
from kbench.serving.adapters import served_name

#: The chat API accepts at most this many stop strings; the rest are applied client-side.
_MAX_API_STOPS = 4
_REASONING_FIELDS = ("reasoning_content", "reasoning")


def _split_credentials(url: str) -> tuple[str, dict[str, str]]:
    """`url` without its user:password@ and, if it had them, the Basic Authorization header that
    carries them instead, so that no library ever logs a URL holding credentials."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, {}
    userinfo, _, host = parts.netloc.rpartition("@")
    token = base64.b64encode(unquote(userinfo).encode()).decode()
    return urlunsplit(parts._replace(netloc=host)), {"Authorization": f"Basic {token}"}


@register_backend("openai")
class OpenAIBackend(Backend):
    has_weights = False
    remote = True
    serves_adapters = True

    def __init__(self, config: ModelConfig) -> None:
        if not config.base_url:
            raise BackendError("the openai backend needs model.base_url (e.g. http://host:8000/v1)")
        api_key = os.environ.get(config.api_key_env)
        if not api_key:
            raise BackendError(
                f"the openai backend reads its API key from ${config.api_key_env}, which is unset "
                "(set it to any value for a local server that needs no key)"
            )
        self._connect(config, config.base_url, config.path, api_key)

    def _connect(self, config: ModelConfig, base_url: str, model_name: str, api_key: str) -> None:
        """Talk to `model_name` at `base_url` (a subclass may start the server first)."""
        from openai import OpenAI

        self.model_name = model_name
        #: The endpoint as messages name it: base_url without credentials.
        self.endpoint = redact_url(base_url)
        self.api_key_env = config.api_key_env
        self.concurrency = config.max_concurrent_requests
        base_url, headers = _split_credentials(base_url)
        self._client = OpenAI(base_url=base_url, api_key=api_key, timeout=config.request_timeout_s,
                              default_headers=headers)

    def load_adapter(self, path: str, *, merge: bool = False) -> None:
        """Ask for the adapter in `path` by the name the server serves it under (checked now, so a
        cell stops before its first trajectory when the server lacks it)."""
        if merge:
            raise BackendError(
                f"the {self.name} backend cannot merge adapter {path} into the weights: a server applies "
                "served adapters unmerged, one per request (recipe merged and stacked adapters need model.backend: hf)"
            )
        self.model_name = self._serve_adapter(path)

    def _serve_adapter(self, path: str) -> str:
        """The name the endpoint serves the adapter in `path` under, checked against its list."""
        name = served_name(path)
        served = self._served_models()
        if name not in served:
            raise BackendError(
                f"the endpoint {self.endpoint} serves no adapter named {name} ({path} as it is now; it serves "
                f"{len(served)} model(s)): start it with the flags `kbench adapters --vllm-flags` prints (docs/models.md)"
            )
        return name

    def _served_models(self) -> set[str]:
        """The model names the endpoint lists (GET <base_url>/models)."""
        import openai

        try:
            return {model.id for model in self._client.models.list()}
        except (openai.APIConnectionError, openai.APIStatusError) as exc:
            raise self._api_error(exc, "to list its models") from None

    def _api_error(self, exc: Exception, refused: str) -> BackendError:
        """One line for a failed API call: the endpoint unreachable (timeouts included) or what it refused."""
        import openai

        if isinstance(exc, openai.APIStatusError):
            return BackendError(f"the endpoint {self.endpoint} refused {refused}: HTTP {exc.status_code} "
                                f"({type(exc).__name__}); check model.path (the served model's name) and "
                                f"${self.api_key_env}")
        return BackendError(f"cannot reach the OpenAI-compatible endpoint {self.endpoint} ({type(exc).__name__}); "
                            "is the server up at model.base_url?")

    def _complete(self, conversation: Conversation, stop: Sequence[str], max_new_tokens: int) -> Generation:
        import openai

        try:
            response = self._client.chat.completions.create(
                model=self.model_name,
                messages=list(conversation),
                temperature=0.0,
                max_tokens=max_new_tokens,
                stop=list(stop)[:_MAX_API_STOPS] or None,
            )
        except (openai.APIConnectionError, openai.APIStatusError) as exc:  # connection errors include timeouts
            raise self._api_error(exc, "the request") from None
        message = response.choices[0].message
        extra = message.model_extra or {}
        reasoning = next((extra[f] for f in _REASONING_FIELDS if extra.get(f)), None)
        return Generation(truncate_at_stop(message.content or "", stop), reasoning)

    def _generate(self, conversations: Sequence[Conversation], request: Request) -> list[Generation]:
        """Concurrent requests; the server keeps no state per trajectory (`sessions` unused)."""
        if not conversations:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations))) as pool:
            return list(pool.map(lambda c: self._complete(c, request.stop, request.max_new_tokens), conversations))
