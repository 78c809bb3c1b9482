"""BM25 libraries compared: bm25s (sparse matrix of precomputed scores) against rank-bm25
(per-query scoring over every document in Python), on the same tokens.

    python benchmarks/retrieval_bm25.py [--paragraphs 4000] [--queries 100]

Needs bm25s (the 'retrieval' extra) and rank-bm25 (pip install rank-bm25: the peer, not a dependency).

The corpus is real English prose: the paragraphs of the standard library's docstrings (split on
blank lines, 8 words at least), taken in module order until `--paragraphs`. Queries are 6-word
windows of paragraphs chosen with a fixed seed. Both libraries get the tokens of
`metagen.retrieval.bm25.tokenize`; the top-10 of each query is compared (BM25 variants differ
slightly: bm25s "lucene" idf, rank-bm25 Okapi idf with an epsilon floor, so the overlap is
reported, not asserted). Prints the seconds to index and to answer the queries, and the ratio.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import random
import sys
import time
import warnings

import numpy as np

from metagen.retrieval.bm25 import tokenize


def stdlib_paragraphs(count: int) -> list[str]:
    paragraphs: list[str] = []
    warnings.simplefilter("ignore")
    for module in sorted(sys.stdlib_module_names):
        if module.startswith(("_", "idlelib", "tkinter", "turtle", "antigravity", "this")):
            continue
        try:
            loaded = importlib.import_module(module)
        except Exception:  # noqa: BLE001 - platform-specific modules
            continue
        objects = [loaded, *(getattr(loaded, name, None) for name in dir(loaded))]
        for item in objects:
            doc = getattr(item, "__doc__", None)
            for block in (doc if isinstance(doc, str) else "").split("\n\n"):
                text = " ".join(block.split())
                if len(text.split()) >= 8 and text not in paragraphs:
                    paragraphs.append(text)
        if len(paragraphs) >= count:
            return paragraphs[:count]
    return paragraphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paragraphs", type=int, default=4000)
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()
    import bm25s
    import rank_bm25

    texts = stdlib_paragraphs(args.paragraphs)
    tokens = [tokenize(text) for text in texts]
    rng = random.Random(0)
    queries = []
    for text in rng.sample(texts, args.queries):
        words = text.split()
        start = rng.randrange(max(len(words) - 6, 1))
        queries.append(tokenize(" ".join(words[start:start + 6])) or ["the"])
    print(f"{len(texts)} paragraphs, {sum(map(len, tokens))} tokens, {len(queries)} queries")

    start = time.perf_counter()
    index = bm25s.BM25()
    index.index(tokens, show_progress=False)
    bm25s_index = time.perf_counter() - start
    start = time.perf_counter()
    found_s = [index.retrieve([query], k=10, show_progress=False)[0][0].tolist() for query in queries]
    bm25s_query = time.perf_counter() - start

    start = time.perf_counter()
    okapi = rank_bm25.BM25Okapi(tokens)
    rank_index = time.perf_counter() - start
    start = time.perf_counter()
    found_r = [np.argsort(-okapi.get_scores(query), kind="stable")[:10].tolist() for query in queries]
    rank_query = time.perf_counter() - start

    overlap = sum(len(set(a) & set(b)) for a, b in zip(found_s, found_r)) / (10 * len(queries))
    print(f"bm25s      index {bm25s_index:.3f} s   {len(queries)} queries {bm25s_query:.3f} s")
    print(f"rank-bm25  index {rank_index:.3f} s   {len(queries)} queries {rank_query:.3f} s")
    print(f"ratio (rank-bm25 / bm25s): index {rank_index / bm25s_index:.1f}x, queries {rank_query / bm25s_query:.1f}x; "
          f"top-10 overlap {overlap:.2f}")


if __name__ == "__main__":
    main()
