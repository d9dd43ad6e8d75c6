"""Server processes the project starts on loopback and stops itself: started, waited for until a
URL answers, stopped on exit (and by the kernel if its starter dies). Used for llama.cpp's
server and for the MLflow tracking server."""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager


def free_port() -> int:
    """A TCP port nothing listens on at 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether GET `url` returns 200 within `timeout` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop_with_parent() -> None:
    """In the server's process before it starts: Linux sends it SIGTERM when its starter dies,
    even by SIGKILL, so no server outlives the stage that started it."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


@contextmanager
def server_process(command: Sequence[str], ready_url: str, *, name: str, error: type[Exception],
                   startup_timeout: float, env: Mapping[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """Run `command` until `ready_url` answers, yield its process, stop it on exit. A process that
    exits first, or a URL silent past `startup_timeout`, raises `error` naming `name`."""
    log_file = tempfile.TemporaryFile(mode="w+")  # the server's log; its last line names a failure
    process = subprocess.Popen(list(command), stdout=subprocess.DEVNULL, stderr=log_file, text=True,
                               env=None if env is None else dict(env), preexec_fn=_stop_with_parent)
    try:
        deadline = time.monotonic() + startup_timeout
        while not answers(ready_url, timeout=1.0):
            if process.poll() is not None:
                log_file.seek(0)
                tail = log_file.read().strip().splitlines()[-1:] or ["no output"]
                raise error(f"{name} exited at start (code {process.returncode}): {tail[0]}")
            if time.monotonic() > deadline:
                raise error(f"{name} did not answer within {startup_timeout:.0f} s")
            time.sleep(0.5)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log_file.close()
