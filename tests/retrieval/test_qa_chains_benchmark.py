"""benchmarks/qa_chains.py: EM with its standard error, token F1, containment and median costs
per (model, strategy) from a `metagen eval --out` directory; a record costing many times its
group's median (a DSP bootstrap) is listed."""

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "qa_chains.py"
_spec = importlib.util.spec_from_file_location("qa_chains_benchmark", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _record(question: str, answer: str, correct: bool, flops: float) -> dict:
    cost = {"prompt_tokens_computed": flops / 1e9, "generated_tokens": 10, "flops": flops, "wall_seconds": flops / 1e12}
    return {"kind": "live", "id": question, "strategy": "dsp", "n": 1, "fingerprint": {"setup": "abc"},
            "correct": correct, "answer": answer, "text": answer, "cost": cost}


def test_the_table_reads_the_records_against_the_task_answers(tmp_path):
    # multihop-003's answer is Khartoum, multihop-007's Paris, multihop-004's Jabal Marrah
    records = [_record("multihop-003", "Khartoum", True, 1e12), _record("multihop-007", "It is Paris.", False, 2e12),
               _record("multihop-004", "Marrah", False, 3e12), _record("multihop-005", "Cairo", False, 40e12)]
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in [{"kind": "setup"}] + records) + "\n")
    (tmp_path / "run.json").write_text(json.dumps({"models": {"small": {"fingerprint": "abc"}}}))
    table, outliers = bench.rows(tmp_path, "multihop")
    row = dict(zip(table[0], table[1]))
    assert row["model"] == "small" and row["questions"] == "4"
    assert row["EM"] == "0.250" and row["± SE"] == f"{(0.25 * 0.75 / 4) ** 0.5:.3f}"
    # F1: 1, "it is paris" vs "paris" 2·(1/3)·1/(4/3) = 0.5, "marrah" vs "jabal marrah" 2·1·0.5/1.5 = 2/3, 0
    assert row["F1"] == f"{(1 + 0.5 + 2 / 3) / 4:.3f}"
    assert row["contains"] == "0.500"
    assert row["TFLOPs"] == "2.50" and row["mean TFLOPs"] == "11.50"
    assert len(outliers) == 1 and "multihop-005: 40.0 TFLOPs" in outliers[0]


def test_a_question_outside_the_task_is_refused_by_name(tmp_path):
    (tmp_path / "results.jsonl").write_text(json.dumps(_record("gsm8k-1", "4", True, 1e12)) + "\n")
    (tmp_path / "run.json").write_text(json.dumps({"models": {}}))
    with pytest.raises(ValueError, match="question 'gsm8k-1' is not in task multihop"):
        bench.rows(tmp_path, "multihop")


def test_recall_counts_the_supporting_paragraphs_among_the_retrievers_best(tmp_path):
    pytest.importorskip("bm25s")
    records = [_record(question, "x", False, 1e12) for question in ("multihop-003", "multihop-007")]
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    everything = bench.recall(tmp_path, 1000)  # k above the corpus size: every paragraph with a shared term
    assert set(everything) == {"hop 1", "hop 2", "hop 2, the follow-up", "hop 2, the bridge's name"}
    assert everything["hop 1"] == everything["hop 2, the bridge's name"] == 1.0
    one = bench.recall(tmp_path, 1)
    assert all(0.0 <= share <= 1.0 for share in one.values()) and one["hop 2"] <= everything["hop 2"]
    (tmp_path / "results.jsonl").write_text(json.dumps(_record("gsm8k-1", "4", True, 1e12)) + "\n")
    with pytest.raises(ValueError, match="holds no multihop question"):
        bench.recall(tmp_path, 3)


def test_recall_over_every_question_counts_the_title_as_often_as_asked(monkeypatch, tmp_path):
    pytest.importorskip("bm25s")
    monkeypatch.setenv("METAGEN_CACHE", str(tmp_path / "cache"))
    ignored, weighted = bench.recall(None, 3, "bm25?title_weight=0"), bench.recall(None, 3, "bm25?title_weight=3")
    # a facts paragraph names its country in its title only (docs/benchmarks/retrieval-chains.md)
    assert weighted["hop 2, the follow-up"] > ignored["hop 2, the follow-up"] + 0.3
