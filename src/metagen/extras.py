"""The install line of each optional extra, for the error raised when one is missing.

metagen installs from a checkout of its repository (`pip install -e '.[serve]'`); the name
`metagen` on the public package index belongs to an unrelated project, so no message installs
by that name. An extra's requirements are read from the installed
distribution's metadata (pyproject.toml's `[project.optional-dependencies]`, declared there
once), so the line names exactly what the extra installs and works from any directory:

    >>> install_line("serve")
    "pip install 'fastapi>=0.110' 'uvicorn>=0.29' (or pip install -e '.[serve]' in a metagen checkout)"

Imported only when an error is built: `importlib.metadata` is not loaded by `import metagen`.
"""

from __future__ import annotations

import re
import shlex

DISTRIBUTION = "metagen"
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([\w.-]+)["']""")


def requirements(extra: str | None) -> list[str]:
    """The requirement strings of `extra` ("serve" -> ["fastapi>=0.110", "uvicorn>=0.29"]), or of
    the core install for None; [] when the distribution's metadata cannot be read."""
    from importlib import metadata

    try:
        declared = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    found = []
    for line in declared:
        requirement, _, marker = line.partition(";")
        named = _EXTRA_MARKER.search(marker)
        if (named.group(1) if named else None) == extra:
            found.append(requirement.strip().replace(" ", ""))
    return found


def install_line(extra: str) -> str:
    """The command that installs `extra`: its requirements by name, and the checkout's form."""
    checkout = f"pip install -e '.[{extra}]' in a metagen checkout"
    packages = requirements(extra)
    if not packages:
        return checkout
    return f"pip install {' '.join(shlex.quote(package) for package in packages)} (or {checkout})"


def missing(extra: str, feature: str) -> ImportError:
    """ImportError for a feature that needs `extra`: "the 'plot' extra is needed for <feature>: pip install ..."."""
    return ImportError(f"the '{extra}' extra is needed for {feature}: {install_line(extra)}")


def core_requirement(project: str) -> str:
    """The pip line of one core dependency (a broken install lacks it): "pip install 'math-verify[...]>=0.7'"."""
    for requirement in requirements(None):
        name = re.split(r"[\[<>=!~ ]", requirement, maxsplit=1)[0]
        if name.lower().replace("_", "-") == project.lower().replace("_", "-"):
            return f"pip install {shlex.quote(requirement)}"
    return f"pip install {shlex.quote(project)}"
