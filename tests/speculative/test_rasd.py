"""RASD: the suffix array's longest match and continuations on hand-built datastores, the trie
of continuations and the fusion of two trees against hand-computed tries, the drafter's
retrieval from corpus / earlier outputs / context, and greedy equal to plain greedy on
SmolLM2 with a corpus holding the continuation (and most drafts accepted there)."""

from __future__ import annotations

import random

import pytest
import torch

from metagen.decoding import generate
from metagen.sampling import SamplingParams
from metagen.speculative import SpeculativeConfig, speculative_generate
from metagen.speculative.rasd import RasdDrafter, load_corpus
from metagen.speculative.suffix_array import SEPARATOR, SuffixArray
from metagen.speculative.token_trie import continuation_tree, fuse_trees

from tests.decoding.helpers import assert_follows
from tests.decoding.toy_model import BOS, A, C
from tests.speculative.test_loop import PROMPT, chain_distribution
from tests.speculative.test_tree import TreeToyModel, tree_drafter

pytestmark = pytest.mark.usefixtures("one_thread")

TREE = SpeculativeConfig(num_draft_tokens=3, verify="multi-draft")
S = SEPARATOR


def test_suffix_order_matches_sorting_the_suffixes():
    rng = random.Random(0)
    for _ in range(100):
        text = [rng.choice([S, 0, 1, 2]) for _ in range(rng.randint(0, 30))]
        assert SuffixArray(text).order.tolist() == sorted(range(len(text)), key=lambda i: text[i:])


def test_longest_match_and_continuations_on_a_hand_built_store():
    """Text: 5 1 2 3 | 7 1 2 4 9 | 1 2 3 8 | 2 3 (| = separator).
    Query ... 0 1 2: "1 2" occurs three times (positions 1, 5, 10), "0 1 2" never: L = 2; the
    range is sorted by what follows: 3 (pos 1: then separator), 3 8 (pos 10), 4 9 (pos 5)."""
    store = SuffixArray([5, 1, 2, 3, S, 7, 1, 2, 4, 9, S, 1, 2, 3, 8, S, 2, 3])
    assert store.longest_match([0, 1, 2], 8)[0] == 2
    assert store.continuations([0, 1, 2], 8, 3) == (2, [[3], [3, 8], [4, 9]])
    assert store.continuations([0, 1, 2], 2, 1) == (2, [[3], [4]])  # the range's two ends
    assert store.continuations([7, 1, 2], 8, 2) == (3, [[4, 9]])  # the longer match wins
    # "2 3" at the end of the text and before a separator has no follower; "1 2 3" at 11 has 8
    assert store.continuations([9, 2, 3], 4, 4) == (2, [[8]])
    assert store.continuations([6], 4, 4) == (0, [])
    assert store.longest_match([7, 1, 2], 2)[0] == 2  # at most max_length tokens looked up


def test_a_row_matches_itself_only_where_a_token_follows():
    store = SuffixArray([1, 2, 3, 1, 2])
    assert store.continuations([1, 2, 3, 1, 2], 4, 3) == (2, [[3, 1, 2]])


def test_continuation_tree_is_the_trie_by_frequency():
    """Runs 3 4 5 / 3 4 6 / 3 7 / 8: counts 3:3, 4:2, 7:1, 8:1, 5:1, 6:1. Order by (-count,
    depth, first appearance): 3, 4, 8, 7, 5, 6 (8 and 7: 8 shallower)."""
    tokens, parents = continuation_tree([[3, 4, 5], [3, 4, 6], [3, 7], [8]], 10)
    assert tokens == [3, 4, 8, 7, 5, 6] and parents == [-1, 0, -1, 0, 1, 1]
    assert continuation_tree([[3, 4, 5], [3, 4, 6], [3, 7], [8]], 3) == ([3, 4, 8], [-1, 0, -1])
    assert continuation_tree([], 5) == ([], [])


def test_fuse_trees_is_the_prefix_merge():
    """Retrieval tree: a-b-c and a-d; model tree: a-b-e, f. Merged level by level, retrieval
    first: level 1: a, f; level 2: b, d (under a); level 3: c (a-b), e (a-b)."""
    a, b, c, d, e, f = 10, 11, 12, 13, 14, 15
    retrieval = ([a, b, c, d], [-1, 0, 1, 0])
    model = ([a, f, b, e], [-1, -1, 0, 2])
    assert fuse_trees([retrieval, model], 10) == ([a, f, b, d, c, e], [-1, -1, 0, 0, 2, 2])
    # a budget of 4 keeps the first four joins; c and e (under b) are left out
    assert fuse_trees([retrieval, model], 4) == ([a, f, b, d], [-1, -1, 0, 0])
    assert fuse_trees([retrieval, ([], [])], 10) == ([a, b, d, c], [-1, 0, 0, 1])  # renumbered by level
    assert fuse_trees([], 3) == ([], [])


def test_the_drafter_retrieves_from_the_corpus_history_and_context():
    drafter = RasdDrafter([5, 6, 7, 8, S], continuations=4)
    assert drafter.retrieve([1, 5, 6], 3) == [[7, 8]]  # the corpus: "5 6" then 7 8
    assert drafter.retrieve([1, 2, 1], 3) == [[2, 1]]  # the context itself: "1" then 2 1
    drafter.finish([[9, 5, 6, 4, 4]])
    # "5 6" in corpus and history (equal length: both), "9 5 6" only in the history
    assert sorted(drafter.retrieve([2, 5, 6], 2)) == [[4, 4], [7, 8]]
    assert drafter.retrieve([9, 5, 6], 2) == [[4, 4]]
    draft = drafter.propose([[9, 5, 6], [3]], [2, 2], None, None)
    assert draft.tokens == [[4, 4], []] and draft.parents == [[-1, 0], []] and draft.probs == [None, None]


def test_the_history_keeps_at_most_memory_size_tokens_in_whole_documents():
    drafter = RasdDrafter(memory_size=6)
    drafter.finish([[1, 2], [3, 4, 5]])
    assert drafter.history_tokens == [1, 2, S, 3, 4, 5, S][3:]  # the oldest document left whole
    assert RasdDrafter(remember_outputs=False).history is None


def test_load_corpus_encodes_each_document(tmp_path):
    class Letters:
        def encode(self, text, add_special_tokens=True):
            assert not add_special_tokens
            return [ord(ch) - ord("a") for ch in text if ch.isalpha()]

    path = tmp_path / "corpus.txt"
    path.write_text("ab c\n\n\n\nde\n", encoding="utf-8")
    assert load_corpus(path, Letters()) == [0, 1, 2, S, 3, 4, S]
    with pytest.raises(FileNotFoundError, match="draft_corpus='.*missing.txt' is not a file"):
        load_corpus(tmp_path / "missing.txt", Letters())
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="is not UTF-8"):
        load_corpus(tmp_path / "bad.txt", Letters())


@pytest.mark.parametrize("options, message", [({"max_nodes": 0}, "max_nodes=0"),
                                              ({"continuations": True}, "continuations=True")])
def test_invalid_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        RasdDrafter(**options)


@pytest.mark.parametrize("with_model", [False, True], ids=["retrieval", "fused"])
def test_rasd_trees_keep_the_target_law_and_plain_greedy(with_model):
    """Point-mass trees (the model's tokens too) under recursive rejection sampling."""
    def drafter():
        return RasdDrafter([A, C, A, C, A, S], model=tree_drafter() if with_model else None, max_nodes=6)

    params = SamplingParams(n=3000, max_tokens=4, seed=5)
    result = speculative_generate(TreeToyModel(), drafter(), PROMPT, params, TREE)
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    assert 0 < result.cost.accepted_tokens < result.cost.draft_tokens
    greedy = SamplingParams(temperature=0, max_tokens=7)
    for prompt in ([BOS], PROMPT):
        plain = generate(TreeToyModel(), prompt, greedy).completions[0].token_ids
        assert speculative_generate(TreeToyModel(), drafter(), prompt, greedy, TREE).completions[0].token_ids == plain


@pytest.mark.slow
def test_rasd_greedy_equals_plain_greedy_on_smollm2_with_a_corpus(model_fp32, tmp_path):
    """The corpus holds the answer (plain greedy's text, among other documents) and the prompt
    does not: retrieval from the corpus proposes it, so most drafts are kept, while the same
    drafter without the corpus (context and history only) barely gets past one token a step."""
    from metagen.speculative import make_drafter

    prompt = [{"role": "user", "content": "Describe a lighthouse keeper's day in two sentences."}]
    params = SamplingParams(temperature=0, max_tokens=40)
    plain = generate(model_fp32, prompt, params).completions[0]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(f"A list of harbours.\n\n{plain.text}\n\nThe keeper's book was lost in 1931.\n",
                      encoding="utf-8")
    config = SpeculativeConfig(num_draft_tokens=6, verify="multi-draft")
    efficiency = {}
    for name, options in (("corpus", {"draft_corpus": str(corpus)}), ("none", {})):
        spec = speculative_generate(model_fp32, make_drafter("rasd", model_fp32, **options), prompt, params, config)
        assert spec.completions[0].token_ids == plain.token_ids, name
        efficiency[name] = spec.cost.block_efficiency
    assert efficiency["corpus"] > 1.5 and efficiency["corpus"] > efficiency["none"] + 1.0, efficiency
