import json
import os
import shutil
import subprocess

import pytest
import torch

# Two intra-op threads per test process; one each when make test runs two xdist workers (two
# workers of two threads on two cores make every small op wait for a core). The processes a test
# starts (the CLI, a server, a page's example) inherit the same count through OMP_NUM_THREADS:
# left at two threads beside the other worker they ran 7-9x slower than on one.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = max(1, 2 // WORKERS)
torch.set_num_threads(THREADS)
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))


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


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A random 2-layer Llama HF directory (H=32, V=49152, the embedded model's tokenizer):
    converts in milliseconds, so cache and compression tests can convert it many times. Every
    linear fits the int4 kernel (N % 16 = 0, K % 32 = 0)."""
    from gguf import GGUFReader
    from safetensors.torch import save_file

    from metagen.models import embedded_model_path
    from metagen.models.tokenizer import Tokenizer

    directory = tmp_path_factory.mktemp("tiny-llama")
    config = {
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "tie_word_embeddings": True,
    }
    (directory / "config.json").write_text(json.dumps(config))
    generator = torch.Generator().manual_seed(0)

    def random(*shape):
        return torch.randn(*shape, generator=generator) * 0.1

    tensors = {"model.embed_tokens.weight": random(49152, 32), "model.norm.weight": 1 + random(32)}
    for i in range(2):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": 1 + random(32), p + "post_attention_layernorm.weight": 1 + random(32),
            p + "self_attn.q_proj.weight": random(32, 32), p + "self_attn.k_proj.weight": random(16, 32),
            p + "self_attn.v_proj.weight": random(16, 32), p + "self_attn.o_proj.weight": random(32, 32),
            p + "mlp.gate_proj.weight": random(64, 32), p + "mlp.up_proj.weight": random(64, 32),
            p + "mlp.down_proj.weight": random(32, 64),
        }
    save_file(tensors, str(directory / "model.safetensors"))
    Tokenizer.from_gguf(GGUFReader(str(embedded_model_path()))).save(directory)
    return directory
