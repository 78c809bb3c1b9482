"""A real `metagen serve` (uvicorn, the embedded model) on 127.0.0.1: `serve_process` starts the
command in a subprocess on a free port, waits for /health and stops it (SIGTERM, then SIGKILL
of its process group) when the block ends, leaving no process behind. `llama_process` does the
same for llama-cpp-python's server over the embedded GGUF (a backend of proxy mode)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import metagen

STARTUP_SECONDS = 300  # a fresh cache converts the embedded weights first


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    def __init__(self, process: subprocess.Popen, port: int) -> None:
        self.process, self.port = process, port
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=10) as answer:
            return answer.read().decode()

    def metric(self, name: str) -> float:
        """The value of an unlabelled metric (or the sum over its labels) from /metrics."""
        total = 0.0
        for line in self.get("/metrics").splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def alone_and_together(self, run, requests: list) -> tuple[list, list, float]:
        """`run(request)` for each request one after another, then all at once from threads: both
        lists of answers and the mean rows per decode step while they ran together."""
        alone = [run(request) for request in requests]
        rows_before = self.metric("metagen_decode_step_rows_total")
        steps_before = self.metric("metagen_decode_steps_total")
        with ThreadPoolExecutor(len(requests)) as pool:
            together = list(pool.map(run, requests))
        rows = self.metric("metagen_decode_step_rows_total") - rows_before
        steps = self.metric("metagen_decode_steps_total") - steps_before
        return alone, together, rows / steps


@contextmanager
def serve_process(*options: str):
    """`metagen serve` with `options` (the local model on the test process's threads, OMP_NUM_THREADS,
    else 2, unless --backend is given)."""
    threads = () if "--backend" in options else ("--threads", os.environ.get("OMP_NUM_THREADS", "2"))
    command = [sys.executable, "-m", "metagen.cli", "serve", *threads, *options]
    with _running(command, "/health", '"ok"') as server:
        yield server


@contextmanager
def llama_process():
    """llama-cpp-python's server over the embedded GGUF, one thread. --n_batch 1: the build on this
    machine crashes evaluating more than one token per batch (tests/remote/conftest.py)."""
    from metagen.models import embedded_model_path

    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(embedded_model_path()), "--host",
               "127.0.0.1", "--n_threads", "1", "--n_batch", "1", "--n_ctx", "2048"]
    with _running(command, "/v1/models", '"data"') as server:
        yield server


@contextmanager
def _running(command: list[str], ready_path: str, ready_text: str):
    """`command` + --port P on a free port, until GET `ready_path` contains `ready_text`; stopped
    (SIGTERM, then SIGKILL of its process group) when the block ends."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(Path(metagen.__file__).parents[1]))
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty server never blocks on a full pipe
    process = subprocess.Popen([*command, "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                               stderr=log, text=True, start_new_session=True)
    server = Server(process, port)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"{command[2]} exited with {process.returncode}: {log.read()[-2000:]}")
            try:
                if ready_text in server.get(ready_path):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[2]} did not answer {ready_path} within {STARTUP_SECONDS} s")
            time.sleep(0.2)
        yield server
    finally:
        stop(server)
        log.close()


def stop(server: Server) -> None:
    """End the server's process (and its group) if it still runs."""
    process = server.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


