"""A retriever named on the command line: "bm25:PATH", "dense:PATH" or an http(s):// URL.

A local retriever takes its settings after the path, as a query string:
"bm25:wiki.jsonl?title_weight=3&k1=0.9&b=0.4" (`OPTIONS`: BM25's k1 and b, and title_weight,
how many times a passage's title counts, `BM25Retriever`). `parse_retriever_spec` checks the
text (kind known, the corpus path existing, each option known and in range, the URL well
formed) without loading anything, so a bad --retriever is refused before any model loads;
`make_retriever` builds the retriever (indexing the corpus, or reading its cached index).
"""

from __future__ import annotations

from pathlib import Path

from metagen.retrieval.base import MAX_TITLE_WEIGHT

KINDS = ("bm25", "dense")
FORMS = "bm25:PATH | dense:PATH | http(s)://HOST[:PORT]/PATH"
# kind -> option -> (type, whether a value is in range, what it must be): a local retriever's
# settings after "?"
OPTIONS = {
    "bm25": {"k1": (float, lambda v: v > 0, "a number > 0 (term-frequency saturation)"),
             "b": (float, lambda v: 0 <= v <= 1, "a number in [0, 1] (length normalization)"),
             "title_weight": (int, lambda v: 0 <= v <= MAX_TITLE_WEIGHT,
                              f"an int in [0, {MAX_TITLE_WEIGHT}] (times a passage's title counts)")},
    "dense": {},
}


def parse_retriever_spec(spec: object, name: str = "retriever") -> tuple[str, str, dict]:
    """(kind, target, options): ("bm25" | "dense", the corpus path, its settings) or ("http", the
    URL, {}); ValueError naming `name`, the value and the allowed forms (or the option, its value
    and its range) otherwise."""
    from metagen.retrieval.corpus import corpus_files
    from metagen.retrieval.http import check_url

    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{name}={spec!r} must be one of {FORMS}")
    if spec.startswith(("http://", "https://")):
        try:
            return "http", check_url(spec), {}
        except ValueError as error:
            raise ValueError(f"{name}={spec!r}: {error}") from None
    kind, colon, target = spec.partition(":")
    if not colon or kind not in KINDS:
        raise ValueError(f"{name}={spec!r} must be one of {FORMS}")
    target, question, query = target.partition("?")
    options = _options(kind, query, f"{name}={spec!r}") if question else {}
    try:
        corpus_files(Path(target).expanduser())
    except ValueError as error:
        raise ValueError(f"{name}={spec!r}: {error}") from None
    return kind, str(Path(target).expanduser()), options


def _options(kind: str, query: str, where: str) -> dict:
    """The settings of "name=value&name=value" for a `kind` retriever (`OPTIONS`); ValueError
    naming `where`, the option, its value and what it must be."""
    known, options = OPTIONS[kind], {}
    for item in query.split("&"):
        option, equals, text = item.partition("=")
        if option not in known:
            allowed = ", ".join(known) or "none"
            raise ValueError(f"{where}: option {option!r} is not a {kind} setting (settings: {allowed})")
        if not equals or option in options:
            raise ValueError(f"{where}: give option {option!r} once, as {option}=VALUE")
        kind_of, in_range, what = known[option]
        try:
            value = kind_of(text)
        except ValueError:
            raise ValueError(f"{where}: {option}={text!r} is not {what}") from None
        if not in_range(value) or value != value:  # NaN is in no range
            raise ValueError(f"{where}: {option}={text!r} is out of range: must be {what}")
        options[option] = value
    return options


def make_retriever(spec: str, **options):
    """The retriever `spec` names (`parse_retriever_spec`), with its settings; `options` (the
    caller's) go to its constructor too."""
    kind, target, settings = parse_retriever_spec(spec)
    options = {**settings, **options}
    if kind == "http":
        from metagen.retrieval.http import HTTPRetriever

        return HTTPRetriever(target, **options)
    if kind == "bm25":
        from metagen.retrieval.bm25 import BM25Retriever

        return BM25Retriever(target, **options)
    from metagen.retrieval.dense import DenseRetriever

    return DenseRetriever(target, **options)
