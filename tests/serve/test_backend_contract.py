"""Both backends of the app implement the declared `Backend` contract (serve/backend.py), and both
plain-request jobs meet `BackendJob`: every member present, methods with the protocol's
parameters, coroutines where the protocol has them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from metagen.sampling import SamplingParams
from metagen.serve.backend import Backend, BackendJob
from metagen.serve.engine import Engine
from metagen.serve.local import LocalBackend
from metagen.serve.proxy import ProxyBackend, ProxyRequest
from metagen.serve.requests import ServeRequest
from tests.contracts import members, violations


def _remote() -> SimpleNamespace:
    """What `ProxyBackend.__init__` reads of its fleet: the probed profile's model id (no server
    is contacted: the contract is about the backend's own members)."""
    return SimpleNamespace(profile=SimpleNamespace(model="served"))


def test_the_backend_contract_names_what_the_app_uses():
    assert set(members(Backend)) == {"served_name", "max_rows", "model", "texts", "check", "submit",
                                     "strategy_generator", "failure", "health", "model_cards", "tokenize",
                                     "detokenize", "metrics", "close"}


def test_the_local_backend_implements_the_contract(model_fp32):
    backend = LocalBackend(model_fp32, Engine(model_fp32, cache_memory=0, max_rows=4))
    assert Backend in type(backend).__mro__ and isinstance(backend, Backend)
    assert violations(LocalBackend, Backend, backend) == []
    assert backend.model is model_fp32 and backend.max_rows == 4


def test_the_proxy_backend_implements_the_contract():
    backend = ProxyBackend(_remote(), max_rows=3)
    assert Backend in type(backend).__mro__ and isinstance(backend, Backend)
    assert violations(ProxyBackend, Backend, backend) == []
    assert backend.model is None and backend.texts is None and backend.served_name == "served"


@pytest.mark.parametrize("job", [
    ServeRequest([1, 2], SamplingParams(max_tokens=1), lambda event: None),
    ProxyRequest("a prompt", SamplingParams(max_tokens=1), lambda event: None),
], ids=["ServeRequest", "ProxyRequest"])
def test_both_jobs_meet_the_job_contract(job):
    assert isinstance(job, BackendJob)
    assert violations(type(job), BackendJob, job) == []
    assert job.completions == [] and job.prompt_records is None and job.cached_tokens == 0


def test_a_backend_missing_a_member_is_found():
    class Partial(LocalBackend):
        tokenize = Backend.tokenize  # the protocol's empty body

    class Synchronous(ProxyBackend):
        def health(self) -> tuple[int, dict]:
            return 200, {}

    assert violations(Partial, Backend, object()) == [
        "served_name: missing on the instance", "max_rows: missing on the instance", "model: missing on the instance",
        "texts: missing on the instance", "tokenize: not defined by Partial (only declared by Backend)"]
    assert violations(Synchronous, Backend, Synchronous(_remote())) == ["health: the protocol's is async"]
