import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def model_fp32():
    """The embedded SmolLM2-135M-Instruct with fp32 weights (exact comparisons)."""
    from metagen.models import load

    return load(dtype="fp32")


@pytest.fixture(scope="session")
def model():
    """The embedded model in the default dtype."""
    from metagen.models import load

    return load()
