import pytest

pytest.importorskip("llguidance")


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The embedded model's tokenizer (SmolLM2, V = 49152), without the model's weights."""
    import gguf

    from metagen.models.embedded import embedded_model_path
    from metagen.models.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gguf.GGUFReader(embedded_model_path()))
