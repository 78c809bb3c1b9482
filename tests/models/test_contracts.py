"""The model floor's declared contracts (`models.base`): every cache is a `Cache`, the paged one a
`PagedCache`, the native decoder `DepthTruncatable`; each class claiming one defines all of it
with the protocol's signatures; what does not claim one is refused, by name, by the features
that need it."""

import pytest
import torch

from metagen.decoding.prompt_cache import PromptCache
from metagen.models import load
from metagen.models.base import Cache, DepthTruncatable, LanguageModel, PagedCache
from metagen.models.cache import KVCache
from metagen.models.decoder import DecoderModel
from metagen.models.kgram import KGramCache, KGramModel
from metagen.models.transformers_adapter import TransformersCache
from metagen.speculative.drafters import ModelDrafter
from metagen.speculative.self_draft import early_exit_model, quantized_model
from tests.contracts import violations


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load(tiny_checkpoint, dtype="fp32", use_cache=False)


@pytest.fixture(scope="module")
def kgram():
    return KGramModel.train(["ab", "ba"], k=2, c=1.0, level="char", max_context=16)


CACHES = {
    "KVCache": lambda: KVCache(2, 1, 4, torch.float32, 64),
    "KGramCache": lambda: KGramCache(1),
    "TransformersCache": lambda: TransformersCache(1),
}


@pytest.mark.parametrize(("cls", "protocol"), [(KVCache, PagedCache), (KGramCache, Cache), (TransformersCache, Cache)])
def test_each_cache_implements_the_contract_it_claims(cls, protocol):
    cache = CACHES[cls.__name__]()
    assert protocol in cls.__mro__ and isinstance(cache, protocol)  # claimed, and met
    assert violations(cls, protocol, cache) == []


def test_only_the_paged_cache_claims_shared_slots():
    assert isinstance(CACHES["KVCache"](), PagedCache)
    for name in ("KGramCache", "TransformersCache"):
        assert not isinstance(CACHES[name](), PagedCache)


def test_the_check_finds_a_member_a_claiming_class_leaves_out():
    """A class subclassing the protocol inherits its empty bodies (which return None): the check
    must see through that, and through a parameter renamed."""

    class Partial(KGramCache):
        length = Cache.length  # the protocol's empty body, as a class that forgot it would have

    class Renamed(KGramCache):
        def truncate(self, row: int, size: int) -> None:
            super().truncate(row, size)

    assert violations(Partial, Cache, Partial(1)) == ["length: not defined by Partial (only declared by Cache)"]
    assert [problem.split("(")[0] for problem in violations(Renamed, Cache, Renamed(1))] == ["truncate"]


@pytest.mark.parametrize("name", list(CACHES))
def test_length_and_reset_mean_the_same_on_every_cache(name):
    cache = CACHES[name]()
    if name != "KGramCache":  # keys and values need a model: fill rows through the row operations only
        cache.reset(3)
        assert cache.batch_size == 3 and cache.lengths == [0, 0, 0] and cache.length(2) == 0
    else:
        cache.rows[0] += [1, 2, 3]
        cache.fork(0, 2)
        cache.truncate(1, 1)
        assert [cache.length(row) for row in range(3)] == cache.lengths == [3, 1, 3]
        cache.reset(2)
        assert cache.lengths == [0, 0]
    with pytest.raises(ValueError, match="row"):
        cache.length(cache.batch_size)
    with pytest.raises(ValueError, match="batch_size"):
        cache.reset(-1)


def test_models_make_the_caches_their_types_declare(tiny, kgram):
    assert isinstance(tiny.new_cache(1), PagedCache)
    assert isinstance(kgram.new_cache(1), Cache) and not isinstance(kgram.new_cache(1), PagedCache)


def test_only_the_native_decoder_is_depth_truncatable(tiny, kgram):
    assert isinstance(tiny, DepthTruncatable) and violations(DecoderModel, DepthTruncatable) == []
    assert not isinstance(kgram, DepthTruncatable)


def test_every_model_declares_source_and_kv_dtype(tiny, kgram):
    assert LanguageModel.source == "" and LanguageModel.kv_dtype is None
    assert tiny.source == str(tiny.source) and tiny.source and tiny.kv_dtype == "fp32"
    assert kgram.source == "" and kgram.kv_dtype is None
    assert tiny.truncated(1).source == tiny.source


def test_early_exit_drafting_refuses_a_model_without_layers_to_truncate(kgram):
    with pytest.raises(ValueError, match=r"early-exit drafting needs .*DepthTruncatable.*got KGramModel"):
        early_exit_model(kgram, 1)


def test_quantized_drafting_refuses_a_model_not_loaded_from_a_file(kgram):
    with pytest.raises(ValueError, match=r"loaded from a file \(target.source is empty\)"):
        quantized_model(kgram, "int8")


def test_sharing_the_prompt_cache_refuses_a_draft_without_a_paged_cache(tiny, kgram):
    target_cache = tiny.new_cache(1)
    tiny.forward(target_cache, [[1, 2, 3, 4]], logits="none")
    drafter = ModelDrafter(kgram, name="k-gram", share_prompt_cache=True)
    with pytest.raises(ValueError, match=r"one kind of PagedCache \(a KVCache\), got KVCache and KGramCache"):
        drafter.start([1, 2, 3, 4], 1, target_cache)
    shared = ModelDrafter(tiny.truncated(1), name="early-exit", share_prompt_cache=True)
    shared.start([1, 2, 3, 4], 2, target_cache)  # a paged cache of the same layout: copied
    assert shared.cache.lengths == [3, 3]


def test_the_prompt_cache_keeps_only_paged_caches(tiny, kgram):
    prompts = PromptCache()
    cache, out, reused = prompts.prefill(kgram, [1, 2], 2)
    assert not reused and cache.lengths == [2, 2] and prompts._entry is None
    cache, out, reused = prompts.prefill(tiny, [1, 2, 3], 2)
    assert not reused and prompts._entry is not None
    cache, again, reused = prompts.prefill(tiny, [1, 2, 3], 2)
    assert reused and isinstance(cache, PagedCache) and cache.lengths == [3, 3]
    torch.testing.assert_close(again.logits, out.logits, rtol=0, atol=0)
