"""Retrievers: passages for a query, from a local corpus (BM25, dense embeddings) or a search
endpoint over HTTP, and the tool that lets a chain search while it writes.

    retriever = make_retriever("bm25:wiki.jsonl")    # or "dense:notes/", "http://127.0.0.1:8080/search"
    retriever.search("when was the Eiffel Tower completed", k=3)   # [Passage(id, text, score, title)]

Light at import: bm25s, the embedding model and httpx load when a retriever is built.
"""

from metagen._lazy import lazy_package

# name -> the submodule that defines it, imported on first use (`metagen._lazy`)
_EXPORTS = {
    "Passage": "base", "Retrieval": "base", "Retriever": "base", "RetrieverTool": "base",
    "format_passages": "base", "read_corpus": "corpus", "BM25Retriever": "bm25", "tokenize": "bm25",
    "DenseRetriever": "dense", "HTTPRetriever": "http", "make_retriever": "spec", "parse_retriever_spec": "spec",
}
lazy_package(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
