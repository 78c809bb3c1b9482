"""Accuracy against cost of the chain strategies on a short-answer task, from `metagen eval --out`.

`metagen eval --task multihop --strategy chain_of_thought,self_ask,self_ask_search,dsp --model A
--model B --out DIR` stores one record per (model, strategy, question) in DIR/results.jsonl; its
summary gives exact-match accuracy and mean cost. This script reads the same records and adds
what a short-answer task is usually also judged by, per (model, strategy):

- EM: normalized exact match (the eval's own grade, `correct`), with its standard error
  √(p(1 − p)/n) over the n questions;
- F1: token F1 of the answer against the reference (SQuAD / HotpotQA's, `scoring.qa_match`);
- contains: the share of answers whose normalized text contains the normalized reference (a
  right answer inside a sentence, which EM counts wrong);
- cost per question, as medians over the questions (the records' `Cost`): prompt tokens
  computed, generated tokens, TFLOPs, wall seconds (retrieval included); and the mean TFLOPs.
  DSP's bootstrap (its program run on the training questions, once per process and config) is
  counted in the Cost of the question that paid it: such a record costs many times the median,
  and the script lists those records below the table with their cost, so that the mean can be
  read with and without them.

Models are named by their label in the run (`run.json`: the file's stem).

`--recall K` (multihop) adds what the retriever alone finds, no model involved, over the
questions the run evaluated (with no DIR: over all 89): the share whose hop-1 paragraph is in
the top K (`--retriever bm25`, the eval's default, `bm25?title_weight=3` and other BM25 settings,
or `dense`: MiniLM embeddings, `retrieval.dense`) for the question
itself; whose hop-2 paragraph is; and whose hop-2 paragraph is for the follow-up a chain should
ask once it knows the bridge (the country hop 1 names): "What is the ATTRIBUTE of BRIDGE?", the
attribute being the one the question asks for (capital, highest point, ...), and for the bridge's
name alone. The chains search with the model's own queries; these say what well-formed ones get.

    python benchmarks/qa_chains.py DIR --task multihop [--recall 3 [--retriever dense]] [--markdown]
    python benchmarks/qa_chains.py --task multihop --recall 3 --retriever "bm25?title_weight=3"
    python benchmarks/qa_chains.py DIR --task s2a_distractors --markdown
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from metagen.eval.qa_tasks import CORPUS, MULTIHOP, multihop_problems, s2a_problems
from metagen.jsonl import json_records
from metagen.scoring.qa_match import normalize_answer, token_f1

TASKS = {"multihop": multihop_problems, "s2a_distractors": s2a_problems}
HEADER = ["model", "strategy", "questions", "EM", "± SE", "F1", "contains", "prompt tokens", "generated tokens",
          "TFLOPs", "mean TFLOPs", "wall s"]
# what the shipped multihop questions ask of the bridge country, most specific first
ATTRIBUTES = ("highest point", "capital", "national anthem", "national", "currency", "language", "location",
              "independence")
OUTLIER = 5.0  # a record above this many times its group's median FLOPs is listed (a DSP bootstrap)


def rows(directory: Path, task: str) -> tuple[list[list[str]], list[str]]:
    """The table (HEADER first) of `directory`'s results.jsonl, one row per (model, strategy) in
    their first appearance, and a line per record costing over OUTLIER times its group's median."""
    gold = {problem.id: problem.answer for problem in TASKS[task]()}
    run = json.loads((directory / "run.json").read_text())
    names = {setup["fingerprint"]: label for label, setup in run["models"].items()}
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for line in (directory / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "live":
            if record["id"] not in gold:
                raise ValueError(f"{directory}/results.jsonl: question {record['id']!r} is not in task {task}")
            groups[(record["fingerprint"]["setup"], record["strategy"])].append(record)
    table, outliers = [list(HEADER)], []
    for (setup, strategy), records in groups.items():
        n = len(records)
        em = sum(bool(r["correct"]) for r in records) / n
        f1 = sum(token_f1(r["answer"], gold[r["id"]]) for r in records) / n
        contains = sum(normalize_answer(gold[r["id"]]) in normalize_answer(r["answer"] or "") for r in records) / n

        def median(field: str) -> float:
            return statistics.median(r["cost"][field] for r in records)

        flops = median("flops")
        table.append([names.get(setup, setup), strategy, str(n), f"{em:.3f}", f"{math.sqrt(em * (1 - em) / n):.3f}",
                      f"{f1:.3f}", f"{contains:.3f}", f"{median('prompt_tokens_computed'):.0f}",
                      f"{median('generated_tokens'):.0f}", f"{flops / 1e12:.2f}",
                      f"{sum(r['cost']['flops'] for r in records) / n / 1e12:.2f}", f"{median('wall_seconds'):.1f}"])
        outliers += [f"{names.get(setup, setup)} {strategy} {r['id']}: {r['cost']['flops'] / 1e12:.1f} TFLOPs, "
                     f"{r['cost']['prompt_tokens_computed']} prompt tokens, {r['cost']['wall_seconds']:.0f} s"
                     for r in records if flops and r["cost"]["flops"] > OUTLIER * flops]
    return table, outliers


def recall(directory: Path | None, k: int, retriever: str = "bm25") -> dict[str, float]:
    """Recall@k of `retriever` ("bm25" or "dense", with settings after "?" as in a retriever spec:
    "bm25?title_weight=3") over the multihop questions `directory`'s run evaluated, or all of
    them with no directory (module docstring):
    {"hop 1": .., "hop 2": .., "hop 2, the follow-up": .., "hop 2, the bridge's name": ..}."""
    from metagen.retrieval.spec import make_retriever

    questions = [record for _, record in json_records(MULTIHOP)]
    if directory is not None:
        records = (json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines())
        asked = {record["id"] for record in records if record.get("kind") == "live"}
        questions = [q for q in questions if q["id"] in asked]
        if not questions:
            raise ValueError(f"{directory}/results.jsonl holds no multihop question")
    kind, question_mark, settings = retriever.partition("?")
    search = make_retriever(f"{kind}:{CORPUS}{question_mark}{settings}").search

    def top(query: str) -> set[str]:
        return {passage.id for passage in search(query, k)}

    found = {"hop 1": 0, "hop 2": 0, "hop 2, the follow-up": 0, "hop 2, the bridge's name": 0}
    for q in questions:
        first, second = q["supporting_ids"]
        attribute = next((a for a in ATTRIBUTES if a in q["question"].lower()), "")
        found["hop 1"] += first in top(q["question"])
        found["hop 2"] += second in top(q["question"])
        found["hop 2, the follow-up"] += second in top(f"What is the {attribute} of {q['bridge']}?")
        found["hop 2, the bridge's name"] += second in top(q["bridge"])
    return {name: count / len(questions) for name, count in found.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path, nargs="?", help="a `metagen eval --out` directory (none: --recall "
                                                                "over every multihop question)")
    parser.add_argument("--task", required=True, choices=tuple(TASKS))
    parser.add_argument("--recall", type=int, default=None, metavar="K",
                        help="multihop: recall@K of the hop-1 / hop-2 paragraphs (module docstring)")
    parser.add_argument("--retriever", default="bm25",
                        help="with --recall: bm25 (default), dense, or bm25 with settings: 'bm25?title_weight=3'")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if args.recall is not None and (args.task != "multihop" or args.recall < 1):
        parser.error(f"--recall {args.recall}: give K >= 1, with --task multihop")
    if args.directory is None:
        if args.recall is None:
            parser.error("give DIR (a `metagen eval --out` directory), or --recall K alone")
        shares = recall(None, args.recall, args.retriever)
        print(f"{args.retriever} recall@{args.recall}: " + ", ".join(f"{name} {share:.3f}" for name, share in shares.items()))
        return
    table, outliers = rows(args.directory, args.task)
    if args.markdown:
        print("\n".join("| " + " | ".join(row) + " |" for row in table[:1]))
        print("|" + "|".join("---" for _ in HEADER) + "|")
        print("\n".join("| " + " | ".join(row) + " |" for row in table[1:]))
    else:
        print("\n".join("  ".join(row) for row in table))
    for line in outliers:
        print(f"over {OUTLIER:g}x the median: {line}")
    if args.recall is not None:
        shares = recall(args.directory, args.recall, args.retriever)
        print(f"{args.retriever} recall@{args.recall}: " + ", ".join(f"{name} {share:.3f}" for name, share in shares.items()))


if __name__ == "__main__":
    main()
