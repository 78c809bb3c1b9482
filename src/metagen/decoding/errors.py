"""The error a `Generator` raises when a request to a remote model finally failed.

A remote backend retries what may pass (connection errors, timeouts, 429 and 5xx) within its
deadline; what still fails is raised as a `RequestFailedError` subclass (`remote.ServerError`
for one server, `remote.FleetUnavailableError` when every endpoint of a fleet is down). The type
is declared here, with no dependency, so that callers can catch it without importing the remote
backend or httpx: the evaluation harness (`eval/running.py`) leaves a problem whose request
failed unfinished and runs the others on. A failure that is also a `ValueError` (a server
refusing the request as invalid, `remote.InvalidRequestError`) is the request's fault, not the
server's, and callers treat it as bad input.
"""

from __future__ import annotations


class RequestFailedError(RuntimeError):
    """A request to a remote model that failed after its retries: the server stayed down, busy
    or broken past the transport's deadline (the server's fault, not the prompt's)."""
