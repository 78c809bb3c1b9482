"""Fixtures of the sandbox and code-execution tests: no sandboxed run may leave a process behind."""

import os
import time
from pathlib import Path

import pytest

from metagen.tools.sandbox import MARKER


def live_sandbox_processes() -> set[int]:
    """Live processes whose command line carries the sandbox marker (launcher, supervisor,
    program and anything it forked), of any user of the machine."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if MARKER.encode() in cmdline:
                pids.add(int(entry))
    return pids


class Leftovers:
    """Calling it lists the sandbox processes that appeared since it was made and are still
    alive after `grace` seconds (others' short runs on a shared machine end within it; a
    process left behind by a run does not)."""

    def __init__(self) -> None:
        self.before = live_sandbox_processes()

    def __call__(self, grace: float = 2.0) -> list[int]:
        deadline = time.monotonic() + grace
        while (new := live_sandbox_processes() - self.before) and time.monotonic() < deadline:
            time.sleep(0.02)
        return sorted(new)


@pytest.fixture
def leftovers() -> Leftovers:
    return Leftovers()


@pytest.fixture
def no_leftovers(leftovers):
    yield
    assert leftovers() == []
