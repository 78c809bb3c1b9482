"""Importing metagen and building the command line import no torch (cli/__init__.py's claim):
each `--help` runs in a fresh interpreter where importing torch, transformers, matplotlib,
numpy or huggingface_hub fails, and still prints its help. Strategy options and the strategy table come from the
strategies' own configs, which import nothing heavy until they run."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCKED = ("torch", "transformers", "matplotlib", "numpy", "huggingface_hub")
RUN = """
import importlib.abc, sys

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is blocked: building the parser must not import it")

sys.meta_path.insert(0, Blocked())
import metagen, metagen.strategies.registry
from metagen.cli import main
try:
    main({argv!r})
except SystemExit as done:
    sys.exit(done.code)
"""


@pytest.mark.parametrize("argv", [["--help"], ["eval", "--help"], ["generate", "--help"], ["serve", "--help"]],
                         ids=lambda argv: " ".join(argv))
def test_help_imports_no_torch(argv):
    done = subprocess.run([sys.executable, "-c", RUN.format(blocked=BLOCKED, argv=argv)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: metagen" in done.stdout


def test_generate_help_lists_strategy_options_and_eval_help_the_strategies():
    """The help texts built without torch are the full ones."""
    run = [sys.executable, "-c", RUN.format(blocked=BLOCKED, argv=["generate", "--help"])]
    assert "--strategy-temperature" in subprocess.run(run, capture_output=True, text=True, timeout=120).stdout
    run = [sys.executable, "-c", RUN.format(blocked=BLOCKED, argv=["eval", "--help"])]
    assert "tokenwise_cd" in subprocess.run(run, capture_output=True, text=True, timeout=120).stdout


WAIT_POLICY = """
import os, sys
os.environ.pop("OMP_WAIT_POLICY", None)
from metagen.cli import generate, serve, main

def report(args):
    print(os.environ.get("OMP_WAIT_POLICY"), "torch" in sys.modules)
    return 0

generate.run = serve.run = report
sys.exit(main({argv!r}))
"""


@pytest.mark.parametrize("argv", [["generate", "Hello"], ["serve"]], ids=["generate", "serve"])
def test_no_command_sets_the_openmp_wait_policy(argv):
    """OpenMP's default (workers spin a few milliseconds, then sleep) decodes as fast as
    OMP_WAIT_POLICY=ACTIVE and does not keep a core busy while the process waits (a sandbox run,
    a server between requests, another program): no command sets it (docs/guides/models.md)."""
    done = subprocess.run([sys.executable, "-c", WAIT_POLICY.format(argv=argv)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["None", "False"]
