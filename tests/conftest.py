import shutil
import subprocess

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

@pytest.fixture
def one_thread():
    """Run on one torch thread: the toy model's tensors are tiny, and on a busy machine a second
    intra-op thread makes each (B, 5) op wait milliseconds for a core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _cannot_create_files_in(path) -> bool:
    try:
        (path / "probe").touch()
    except OSError:
        return True
    (path / "probe").unlink()
    return False


@pytest.fixture
def read_only_dir(tmp_path):
    """An existing directory no file can be created in: mode 555, and immutable (chattr +i)
    when running as root makes the mode no obstacle. Skips where neither works."""
    path = tmp_path / "read_only"
    path.mkdir()
    path.chmod(0o555)
    immutable = False
    if not _cannot_create_files_in(path):
        immutable = bool(shutil.which("chattr")) and subprocess.run(["chattr", "+i", str(path)],
                                                                    capture_output=True).returncode == 0
        if not _cannot_create_files_in(path):
            pytest.skip("cannot make a read-only directory here")
    yield path
    if immutable:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    path.chmod(0o755)


@pytest.fixture(scope="session")
def reference():
    """transformers' tokenizer loaded from the embedded GGUF (the reference of tokenizer and chat tests)."""
    transformers = pytest.importorskip("transformers")
    from metagen.models.embedded import embedded_model_path

    path = embedded_model_path()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture
def random_head():
    """Builds a linear value head with small random weights for a model (seeded): values that
    differ between states, so comparisons of where the head is read can fail."""
    from metagen.scoring.value_head import ValueHead, model_identity

    def build(model, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        head = ValueHead(model.config.hidden_size, identity=model_identity(model))
        head.params["weight"] = torch.randn(model.config.hidden_size, generator=generator) * 0.05
        return head

    return build
