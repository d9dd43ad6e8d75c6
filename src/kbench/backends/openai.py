"""`openai`: any OpenAI-compatible chat endpoint (vLLM, TGI, llama.cpp, `transformers serve`, a hosted API).

The API key is read from the environment variable named by `model.api_key_env`, so it never
appears in params, logs or MLflow. A batch is sent as concurrent requests. Endpoints that
return reasoning text beside the reply (`reasoning_content` in vLLM, `reasoning` elsewhere)
have it passed on so the harness records it as thoughts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kbench.backends.base import (
    Backend,
    BackendError,
    Conversation,
    Generation,
    register_backend,
    truncate_at_stop,
)
from kbench.config import ModelConfig

#: The chat API accepts at most this many stop strings; the rest are applied client-side.
_MAX_API_STOPS = 4
_REASONING_FIELDS = ("reasoning_content", "reasoning")


@register_backend("openai")
class OpenAIBackend(Backend):
    has_weights = False

    def __init__(self, config: ModelConfig) -> None:
        from openai import OpenAI

        if not config.base_url:
            raise BackendError("the openai backend needs model.base_url (e.g. http://host:8000/v1)")
        api_key = os.environ.get(config.api_key_env)
        if not api_key:
            raise BackendError(
                f"the openai backend reads its API key from ${config.api_key_env}, which is unset "
                "(set it to any value for a local server that needs no key)"
            )
        self.model_name = config.path
        self.concurrency = config.max_concurrent_requests
        self._client = OpenAI(base_url=config.base_url, api_key=api_key, timeout=config.request_timeout_s)

    def _complete(self, conversation: Conversation, stop: Sequence[str], max_new_tokens: int) -> Generation:
        response = self._client.chat.completions.create(
            model=self.model_name,
            messages=list(conversation),
            temperature=0.0,
            max_tokens=max_new_tokens,
            stop=list(stop)[:_MAX_API_STOPS] or None,
        )
        message = response.choices[0].message
        extra = message.model_extra or {}
        reasoning = next((extra[f] for f in _REASONING_FIELDS if extra.get(f)), None)
        return Generation(truncate_at_stop(message.content or "", stop), reasoning)

    def generate(
        self,
        conversations: Sequence[Conversation],
        *,
        stop: Sequence[str],
        max_new_tokens: int,
        sessions: Sequence[Any] | None = None,
        share_prefixes: bool = True,
    ) -> list[Generation]:
        """Concurrent requests; the server keeps no state per trajectory (`sessions` unused)."""
        if not conversations:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations))) as pool:
            return list(pool.map(lambda c: self._complete(c, stop, max_new_tokens), conversations))
