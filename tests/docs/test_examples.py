"""Every marked example of the documentation runs, and prints what the page claims (the
convention is in tests/docs/examples.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.docs.examples import Page, matches, pages, read_page
from tests.install_simulation import blocked_modules, blocking
from tests.install_simulation import environment as install_environment

PAGES = pages()


def _run_python(block, namespace: dict) -> str:
    printed = io.StringIO()
    extras = block.install
    installed = contextlib.nullcontext() if extras is None else blocking(blocked_modules(extras))
    with installed, contextlib.redirect_stdout(printed):
        exec(compile(block.code, f"{block.line}", "exec"), namespace)  # noqa: S102 - the docs' own examples
    return printed.getvalue()


def _run_bash(block, directory: Path) -> str:
    code = block.code
    if block.language == "console":  # "$ command" lines are the commands; the rest is their output
        code = "\n".join(line[2:] for line in code.splitlines() if line.startswith("$ "))
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if block.install is not None:
        environment = install_environment(blocked_modules(block.install), environment)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=directory, env=environment,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _run_page(page: Page, directory: Path, port: int | None) -> None:
    namespace: dict = {"__name__": "__docs__"}
    previous = Path.cwd()
    os.chdir(directory)
    try:
        for block in page.blocks:
            code = block.code if port is None else block.code.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
            block = dataclasses.replace(block, code=code)
            where = f"{page.path.name}:{block.line}"
            try:
                printed = _run_python(block, namespace) if block.language in ("python", "py") else _run_bash(block, directory)
            except Exception as error:  # the page and line say which example broke
                raise AssertionError(f"{where}: the example failed: {type(error).__name__}: {error}") from error
            if block.output is not None:
                assert matches(block.output, printed), (
                    f"{where}: printed\n{textwrap.indent(printed, '    ')}\nbut the page claims\n"
                    f"{textwrap.indent(block.output, '    ')}")
    finally:
        os.chdir(previous)


@pytest.mark.parametrize("page", [pytest.param(page, id=str(page.path.relative_to(page.path.parents[1])),
                                               marks=[pytest.mark.slow] if page.slow else [])
                                  for page in PAGES])
def test_page_examples(page: Page, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    port = request.getfixturevalue("docs_server").port if page.serve else None
    _run_page(page, tmp_path, port)


@pytest.fixture(scope="module")
def docs_server():
    """One `metagen serve` of the embedded model for every page with a `run serve` block (its
    start-up costs more than their requests)."""
    from tests.serve.server import serve_process

    with serve_process() as server:
        yield server


def test_convention(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- run -->\n```python\nprint(1 + 1)\n```\n<!-- output -->\n```text\n2\n```\n"
                    "<!-- run slow -->\n```bash\necho hi\n```\n")
    read = read_page(page)
    assert [(b.language, b.output, b.flags) for b in read.blocks] == [
        ("python", "2\n", frozenset()), ("bash", None, frozenset({"slow"}))]
    page.write_text("<!-- run slow install=serve+client -->\n```bash\necho hi\n```\n<!-- run install=core -->\n"
                    "```bash\necho hi\n```\n<!-- run -->\n```bash\necho hi\n```\n")
    assert [block.install for block in read_page(page).blocks] == [frozenset({"serve", "client"}), frozenset(), None]
    page.write_text("<!-- output -->\n```text\n2\n```\n")
    with pytest.raises(ValueError, match="no run block before it"):
        read_page(page)
    page.write_text("<!-- run -->\n```json\n{}\n```\n")
    with pytest.raises(ValueError, match="cannot run a json block"):
        read_page(page)


def test_matching() -> None:
    assert matches("a\n...\nd\n", "a\nb\nc\nd\n")
    assert matches("a\n...\nd\n", "a\nd\n")
    assert matches("took ... s\n", "took 1.5 s   \n")
    assert not matches("a\nd\n", "a\nb\nd\n")
    assert not matches("took ... s\n", "took 1.5 ms\n")


def test_a_block_run_as_on_a_core_install_cannot_import_an_extra(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- run install=core -->\n```python\nimport matplotlib\n```\n")
    with pytest.raises(AssertionError, match="ModuleNotFoundError"):
        _run_page(read_page(page), tmp_path, None)
    page.write_text("<!-- run install=core -->\n```bash\npython -c 'import fastapi'\n```\n")
    with pytest.raises(AssertionError, match="ModuleNotFoundError"):
        _run_page(read_page(page), tmp_path, None)
    page.write_text("<!-- run install=serve -->\n```bash\npython -c 'import fastapi'\n```\n"
                    "<!-- run install=plot -->\n```python\nimport matplotlib\n```\n")
    _run_page(read_page(page), tmp_path, None)
