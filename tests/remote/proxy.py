"""A fault-injecting HTTP proxy (stdlib, threads, 127.0.0.1) in front of a real server.

Each request is forwarded to `upstream` unchanged and its answer passed back, unless a fault is
scripted: `fault("drop")` closes the connection without an answer, `fault("delay", seconds=s)`
forwards after s seconds, `fault("status", status=500)` answers 500, `fault("status",
status=429, headers={"Retry-After": "1"})` a 429. Scripted faults hit the next generation
requests (POSTs), one each; `down = True` drops every request, GETs too (a dead endpoint).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.faults: list[tuple[str, dict]] = []
        self.down = False
        self.seen = 0  # requests received
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def fault(self, kind: str, **options) -> None:
        assert kind in ("drop", "delay", "status"), kind
        with self._lock:
            self.faults.append((kind, options))

    def _next_fault(self, method: str) -> tuple[str, dict] | None:
        with self._lock:
            self.seen += 1
            if self.down:
                return ("drop", {})
            if method == "POST" and self.faults:
                return self.faults.pop(0)
        return None

    def _forward(self, method: str, path: str, headers: dict, body: bytes | None) -> tuple[int, list, bytes]:
        connection = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=120)
        try:
            headers = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection")}
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            connection.close()

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                kind, options = proxy._next_fault(self.command) or ("forward", {})
                if kind == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if kind == "status":
                    return self._reply(options["status"], options.get("headers", {}).items(), b'{"error": "injected"}')
                time.sleep(options.get("seconds", 0.0))
                try:
                    status, headers, payload = proxy._forward(self.command, self.path, dict(self.headers), body)
                except OSError:  # upstream gone: so is this answer
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                kept = [(k, v) for k, v in headers if k.lower() not in ("content-length", "connection",
                                                                       "transfer-encoding")]
                self._reply(status, kept, payload)

            def _reply(self, status: int, headers, payload: bytes) -> None:
                self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (timeouts)

            do_GET = do_POST = _handle

        return Handler
