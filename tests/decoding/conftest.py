import pytest
import torch


@pytest.fixture
def one_thread():
    """Run on one torch thread: the toy model's tensors are tiny, and on a busy machine a second
    intra-op thread makes each (B, 5) op wait milliseconds for a core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
