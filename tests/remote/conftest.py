"""A real llama.cpp server (llama-cpp-python's `llama_cpp.server`) over the embedded model, for
the whole session; skipped with the reason when it cannot run here."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, body: dict | None = None, timeout: float = 60.0) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_llama_server(log_dir) -> tuple[subprocess.Popen, str]:
    """(process, base URL) of a llama.cpp server over the embedded model, answering; skips the
    test with the reason when it cannot run here (the process is stopped then).

    --n_batch 1: the llama-cpp-python 0.3.36 built on this machine crashes (general protection
    fault in libggml-cpu) when it evaluates more than one token per batch; one token per batch
    works, and the embedded model is small enough for it.
    """
    if importlib.util.find_spec("httpx") is None:
        pytest.skip("httpx is not installed (pip install -e '.[remote]')")
    for module in ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "pydantic_settings"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"llama_cpp.server cannot run: {module} is not importable "
                        "(pip install 'llama-cpp-python[server]')")
    from metagen.models import embedded_model_path

    port = free_port()
    log = log_dir / f"server-{port}.log"
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(embedded_model_path()),
               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_batch", "1"]
    with open(log, "wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_until_serving(process, url, log)
    except BaseException:
        stop(process)
        raise
    return process, url


def _die_with_parent() -> None:
    """In the server's process before it starts (Linux): SIGTERM it when the test process dies,
    so a test run killed before its teardown leaves no server behind."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def _wait_until_serving(process: subprocess.Popen, url: str, log) -> None:
    deadline = time.monotonic() + 90
    while True:
        if process.poll() is not None:
            pytest.skip(f"llama_cpp.server exited with {process.returncode} at start (log: {log})")
        try:
            _get(f"{url}/models", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                pytest.skip(f"llama_cpp.server did not answer /v1/models within 90 s (log: {log})")
            time.sleep(0.5)
    try:
        _get(f"{url}/completions", {"prompt": "Hi", "max_tokens": 1})
    except OSError as error:
        pytest.skip(f"llama_cpp.server cannot generate on this machine ({error}; "
                    f"exit code {process.poll()}; log: {log})")


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    """The base URL ("http://127.0.0.1:<port>/v1") of a running llama.cpp server."""
    process, url = start_llama_server(tmp_path_factory.mktemp("llama_server"))
    try:
        yield url
    finally:
        stop(process)
