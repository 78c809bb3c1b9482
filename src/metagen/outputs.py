"""Output directories of the commands (`eval --out`, `theory bon --out`), checked before any
slow work (loading a model, drawing figures) so a bad path fails in milliseconds, not after it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def check_writable_directory(path: str | os.PathLike, option: str = "--out") -> Path:
    """ValueError naming `option` and the path unless `path` is a directory this process can
    write files in, or one it can create (nothing is created: an existing directory is probed
    with a temporary file, a missing one with a temporary directory in its nearest existing
    ancestor, and the probe is removed)."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise ValueError(f"{option} {str(target)!r} exists and is not a directory")
    ancestor = target
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{option} {str(target)!r} cannot be created: {str(ancestor)!r} is a file, not a directory")
    try:
        if ancestor == target:
            descriptor, probe = tempfile.mkstemp(prefix=".metagen-probe-", dir=target)
            os.close(descriptor)
            os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(prefix=".metagen-probe-", dir=ancestor))
    except OSError as error:
        where = "is not writable" if ancestor == target else f"cannot be created in {str(ancestor)!r}"
        raise ValueError(f"{option} {str(target)!r} {where} ({error.strerror})") from None
    return target
