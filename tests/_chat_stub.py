"""A local OpenAI-compatible chat stub for tests: subclass `ChatStub`, define `answer(body)`,
serve it with `serving(cls)`."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ChatStub(BaseHTTPRequestHandler):
    """Answers `POST …/chat/completions` with `answer(body)` and `GET …/models` with one model."""

    def answer(self, body: dict[str, Any]) -> str:
        raise NotImplementedError

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._send({"object": "list", "data": [{"id": "stub", "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = self.answer(body)
        self._send({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}]})

    def _send(self, data: dict[str, Any]) -> None:
        raw = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args) -> None:
        pass


@contextmanager
def serving(handler: type[ChatStub], credentials: str = "") -> Iterator[str]:
    """The stub on a free local port; yields its API root (`http://[credentials@]127.0.0.1:<port>/v1`)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://{credentials + '@' if credentials else ''}127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
