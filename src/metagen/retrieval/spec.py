"""A retriever named on the command line: "bm25:PATH", "dense:PATH" or an http(s):// URL.

`parse_retriever_spec` checks the text (kind known, the corpus path existing, the URL well
formed) without loading anything, so a bad --retriever is refused before any model loads;
`make_retriever` builds the retriever (indexing the corpus, or reading its cached index).
"""

from __future__ import annotations

from pathlib import Path

KINDS = ("bm25", "dense")
FORMS = "bm25:PATH | dense:PATH | http(s)://HOST[:PORT]/PATH"


def parse_retriever_spec(spec: object, name: str = "retriever") -> tuple[str, str]:
    """(kind, target): ("bm25" | "dense", the corpus path) or ("http", the URL); ValueError naming
    `name`, the value and the allowed forms otherwise."""
    from metagen.retrieval.corpus import corpus_files
    from metagen.retrieval.http import check_url

    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{name}={spec!r} must be one of {FORMS}")
    if spec.startswith(("http://", "https://")):
        try:
            return "http", check_url(spec)
        except ValueError as error:
            raise ValueError(f"{name}={spec!r}: {error}") from None
    kind, colon, target = spec.partition(":")
    if not colon or kind not in KINDS:
        raise ValueError(f"{name}={spec!r} must be one of {FORMS}")
    try:
        corpus_files(Path(target).expanduser())
    except ValueError as error:
        raise ValueError(f"{name}={spec!r}: {error}") from None
    return kind, str(Path(target).expanduser())


def make_retriever(spec: str, **options):
    """The retriever `spec` names (`parse_retriever_spec`); options go to its constructor."""
    kind, target = parse_retriever_spec(spec)
    if kind == "http":
        from metagen.retrieval.http import HTTPRetriever

        return HTTPRetriever(target, **options)
    if kind == "bm25":
        from metagen.retrieval.bm25 import BM25Retriever

        return BM25Retriever(target, **options)
    from metagen.retrieval.dense import DenseRetriever

    return DenseRetriever(target, **options)
