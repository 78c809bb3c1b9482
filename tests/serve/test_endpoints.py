"""Every route the app serves is in the serving guide's endpoint table and in app.py's module
docstring, with its method: a new endpoint (docs/ARCHITECTURE.md, "An endpoint") is not done
until a user can find it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from metagen.serve import app  # noqa: E402

GUIDE = Path(__file__).resolve().parents[2] / "docs/guides/serving.md"
ROUTES = sorted({(method, route.path) for router in app.ROUTERS for route in router.routes
                 for method in route.methods})


def _endpoint_rows() -> str:
    text = GUIDE.read_text()
    table = text.split("### Endpoints", 1)[1].split("###", 1)[0]
    return "\n".join(line for line in table.splitlines() if line.startswith("| `"))


def test_the_app_serves_routes():
    assert ("POST", "/v1/chat/completions") in ROUTES and ("GET", "/health") in ROUTES


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_is_in_the_guide(method, path):
    assert re.search(rf"`{method} {re.escape(path)}`", _endpoint_rows()), (
        f"{method} {path} is served but docs/guides/serving.md's endpoint table does not list it")


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_is_in_the_app_docstring(method, path):
    lines = [line.split() for line in app.__doc__.splitlines() if line.strip().startswith(("GET", "POST"))]
    paths = {(words[0], path) for words in lines for path in words[1].split(",") if path.startswith("/")}
    # "POST /tokenize, /detokenize": the second path shares the first's method
    paths |= {(words[0], words[2]) for words in lines if len(words) > 2 and words[2].startswith("/")}
    assert (method, path) in paths, f"{method} {path} is not in the route list of metagen.serve.app's docstring"
