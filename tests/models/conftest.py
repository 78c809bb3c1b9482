import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import metagen

LOCK_HOLDER = """
import sys, time
from pathlib import Path
from metagen.models.disk_cache import EntryLock

lock = EntryLock(Path(sys.argv[1]))
assert lock.acquire(0, "a test")
print("held", flush=True)
time.sleep(300)
"""


@pytest.fixture
def lock_holder():
    """Starts another process holding a cache entry's lock (killed at the end of the test)."""
    processes = []

    def start(entry: Path) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(Path(metagen.__file__).parents[1])}
        process = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(entry)], env=env, stdout=subprocess.PIPE,
                                   text=True)
        processes.append(process)
        assert process.stdout.readline().strip() == "held"
        return process

    yield start
    for process in processes:
        process.kill()
        process.wait()


@pytest.fixture
def temp_cache(tmp_path, monkeypatch):
    """An empty $METAGEN_CACHE for one test; models built in it run the PyTorch path, so no
    test compiles the fused or matrix kernels into it by accident (~40 s each; int4 / int8
    linears use the matrix kernels only when this process resolved them before)."""
    from metagen.models import kernels

    cache = tmp_path / "cache"
    monkeypatch.setenv("METAGEN_CACHE", str(cache))
    monkeypatch.setitem(kernels._state, "module", None)
    monkeypatch.setitem(kernels._state, "matmul", None)
    return cache


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A random 2-layer Llama HF directory (H=32, V=49152, the embedded model's tokenizer):
    converts in milliseconds, so cache tests can convert it many times."""
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
