"""Generators over remote OpenAI-compatible servers (vLLM, SGLang, llama.cpp's server, OpenAI),
one or a fleet of replicas.

Needs the `remote` extra (httpx): `pip install 'metagen[remote]'`. Not imported by `import
metagen`.
"""

from metagen.remote.engines import ENGINES, Engine
from metagen.remote.fleet import FleetGenerator
from metagen.remote.openai_generator import OpenAIGenerator
from metagen.remote.pool import FleetUnavailableError
from metagen.remote.probe import ServerProfile, probe
from metagen.remote.responses import RemoteCompletion
from metagen.remote.transport import InvalidRequestError, ServerError, Transport

__all__ = ["ENGINES", "Engine", "FleetGenerator", "FleetUnavailableError", "InvalidRequestError",
           "OpenAIGenerator", "RemoteCompletion", "ServerError", "ServerProfile", "Transport", "probe"]
