"""Demonstrate-Search-Predict (DSP; Khattab et al. 2022): a retrieval program whose few-shot
demonstrations are bootstrapped from the program's own correct runs on labelled examples.

    result = dsp(generator, question, retriever, DSPConfig(hops=2, demos=2, samples=5),
                 examples=read_examples("train.jsonl"))
    result.answer, result.votes, result.values["context"], result.trace, result.cost

The procedure, for a question q (k = passages, H = hops, S = samples, D = demos):

  Demonstrate  run Search and Predict, zero-shot, on the labelled examples (q_j, a_j) in file order,
               at most `train_limit` of them, keeping each run whose voted answer equals a_j as
               normalized strings (`scoring.answers.answers_match`: lower case, whitespace collapsed,
               surrounding $ and a trailing period dropped), until D are kept. A kept run is a
               demonstration: its question, each query with the passages it found, its answer.
               Without examples (`train` unset) or with D = 0 the program runs zero-shot, and the
               trace says so.
  Search       hop 1 searches q itself; at hop h = 2..H the model, shown the demonstrations, q and
               the passages so far, writes the next query on one line, or DONE when the passages
               suffice, which ends the search. Each search returns the k best passages that no
               earlier hop returned (`RetrieverTool(distinct=True)`), numbered on: the context
               never holds a passage twice.
  Predict      S answers sampled in one request from the demonstrations, q and the context, each
               read to its end of line; the answer is the majority vote over them, compared as
               normalized strings (`voting.tally`, `voting.winner`; a tie goes to the answer seen first).

Cost per question: at most H - 1 query calls, H searches (wall seconds, and a dense retriever's
query encoding) and one call drawing S samples. Bootstrapping runs that program on up to
`train_limit` examples, so it costs up to `train_limit` questions' work; it depends on the examples,
not on q: call `bootstrap` once and give its demonstrations to each `dsp` call to amortize it. The
registered strategy (`metagen generate --strategy dsp`, `metagen eval`, the server) does so itself:
it bootstraps once per generator, training file (its path, size and modification time) and
config, counts that cost in the Cost of the question that paid it, and hands the demonstrations
to every later question (`BootstrapCache`; a new process, such as a resumed `metagen eval`, pays
once again); the trace's "demonstrate" entry carries that share alone, or says it was reused.

Built on `chain.py`'s steps, driven one hop at a time by a `ChainRun` (the hops end on the model's
DONE, which a fixed list of steps cannot say), and on `chain_programs.SearchConfig`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from metagen.decoding.cost import Cost
from metagen.jsonl import json_records
from metagen.retrieval.base import Retriever, RetrieverTool
from metagen.scoring.answers import answers_match
from metagen.strategies import runners
from metagen.strategies.chain import CallTool, ChainResult, ChainRun, Generate, TraceEntry
from metagen.strategies.chain_programs import CHAIN, SearchConfig, answer_params, clean_answer, load_retriever
from metagen.strategies.options import option
from metagen.strategies.spec import StrategySpec, register
from metagen.strategies.voting import tally, winner

if TYPE_CHECKING:
    import torch

    from metagen.decoding.generator import Generator

DONE = "DONE"  # the query that ends the search
QUERY = ("{demonstrations}Question: {question}\n{context}\n\nWrite the next search query, on one line, for what the "
         "passages above do not yet say. If they already answer the question, write only " + DONE + ".")
PREDICT = "{demonstrations}Question: {question}\n{context}\n\nAnswer the question in a few words, from the passages."
HOP = "Search {hop}: {query}\n{passages}"  # one hop of a context: its query, then the passages it found


@dataclass(frozen=True)
class DSPConfig(SearchConfig):
    """SearchConfig (the retriever, `passages` a search) and DSP's own budget: hops, demos,
    samples, and the labelled examples demonstrations are bootstrapped from (`train`,
    `train_limit`). `train` is checked to be a file when the config is built (read when run)."""

    hops: int = option(2, int, "searches at most: hop 1 searches the question, each later hop a query the model "
                       "writes from the passages so far (or DONE, which ends the search)", low=1, high=64,
                       sizes_work=True)
    demos: int = option(2, int, "demonstrations bootstrapped from --train: runs on its examples whose answer was "
                        "right (0: zero-shot)", low=0, high=64, sizes_work=True)
    samples: int = option(5, int, "answers sampled for the majority vote", low=1, high=64, sizes_work=True)
    train: str | None = option(None, str, "JSONL of labelled examples (question, answer) to bootstrap "
                               "demonstrations from (none: zero-shot)", optional=True, opens=True)
    train_limit: int = option(16, int, "examples run at most while bootstrapping demonstrations", low=1, high=1000,
                              sizes_work=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.train is not None and not Path(self.train).expanduser().is_file():
            raise ValueError(f"train={self.train!r} is not a file: give a JSONL of question and answer fields")


@dataclass(frozen=True)
class Demonstration:
    """One bootstrapped example: its question, the context its run retrieved (each query with its
    passages, `HOP`) and its answer (right by the label)."""

    question: str
    context: str
    answer: str

    def text(self) -> str:
        return f"Question: {self.question}\n{self.context}\nAnswer: {self.answer}\n\n"


@dataclass(frozen=True)
class Bootstrap:
    """What `bootstrap` found: the demonstrations kept, the examples run and their summed Cost, and
    how many examples it was offered."""

    demonstrations: tuple[Demonstration, ...]
    tried: int
    cost: Cost
    offered: int = 0


def read_examples(path: str | Path) -> list[tuple[str, str]]:
    """(question, answer) per line of a JSONL file (blank lines skipped); ValueError naming the
    file and line of one that is not an object with a non-empty string `question` and an `answer`
    (a string or a number)."""
    examples = []
    for number, record in json_records(Path(path).expanduser()):
        question, answer = record.get("question"), record.get("answer")
        if not isinstance(question, str) or not question.strip() or isinstance(answer, bool) \
                or not isinstance(answer, (str, int, float)):
            raise ValueError(f"{path}:{number}: an example is an object with a non-empty string 'question' "
                             "and an 'answer' (a string or a number)")
        examples.append((question, str(answer)))
    return examples


def search_predict(generator: Generator, question: str, retriever: Retriever, config: DSPConfig,
                   demonstrations: Sequence[Demonstration] = (), *, rng: torch.Generator | None = None) -> ChainResult:
    """Search, then Predict, with `demonstrations` in both prompts (see the module). The result's
    candidates: the S sampled answers (their `answer` read from the line); chosen: the vote's
    winner; votes: answer -> count; values: question, queries (one a line), context,
    demonstrations (and the last hop's number and query); trace: each query call ("query"), each search ("hop/search": its query in,
    its new passages out) and the predict call ("answer")."""
    run = ChainRun(generator, config, rng)
    short = answer_params(config)
    write_query = Generate("query", QUERY, params=short, prefill="Search {hop}:")
    search = CallTool("hop", RetrieverTool(retriever, config.passages, distinct=True), "{query}")
    values = {"question": question, "demonstrations": "".join(demo.text() for demo in demonstrations),
              "context": ""}
    queries = []
    for hop in range(1, config.hops + 1):
        values["hop"], query = str(hop), question
        if hop > 1:
            query = " ".join(run.step(write_query, values).text.split())
            if not query or query.rstrip(".").upper() == DONE:
                break
        values["query"] = query
        passages = run.step(search, values).text
        queries.append(query)
        block = HOP.format(hop=hop, query=query, passages=passages)
        values["context"] = f"{values['context']}\n{block}" if values["context"] else block
    samples = run.sample(Generate("answer", PREDICT, params=short, prefill="Answer:"), values, config.samples)
    for sample in samples:
        sample.answer = clean_answer(sample.text) or None
    votes = tally(samples, [1.0] * len(samples))
    values["queries"] = "\n".join(queries)
    return ChainResult(samples, cost=run.cost, chosen=winner(samples, votes), votes=votes, values=values,
                       trace=run.trace)


def bootstrap(generator: Generator, retriever: Retriever, examples: Sequence[tuple[str, str]], config: DSPConfig,
              *, rng: torch.Generator | None = None) -> Bootstrap:
    """Demonstrate: `search_predict` zero-shot on the examples in order (at most train_limit),
    keeping the runs whose voted answer matches the label as normalized strings, until
    config.demos are kept. Cost: every example run, kept or not."""
    kept, cost, tried = [], Cost(), 0
    for question, answer in examples[: config.train_limit]:
        if len(kept) >= config.demos:
            break
        result = search_predict(generator, question, retriever, config, rng=rng)
        cost += result.cost
        tried += 1
        if answers_match(result.answer, answer):
            kept.append(Demonstration(question, result.values["context"], result.answer))
    return Bootstrap(tuple(kept), tried, cost, len(examples))


def dsp(generator: Generator, question: str, retriever: Retriever, config: DSPConfig | None = None, *,
        examples: Sequence[tuple[str, str]] | None = None, demonstrations: Bootstrap | None = None,
        demonstrations_paid: bool = False, rng: torch.Generator | None = None) -> ChainResult:
    """Demonstrate-Search-Predict on `question` (see the module). Demonstrations: `demonstrations`
    (a `bootstrap` done earlier: its cost is counted here only with `demonstrations_paid`, the
    call it was done for), else bootstrapped now from `examples` (its cost counted), else none
    (zero-shot). The trace starts with a "demonstrate"
    entry (input: where the demonstrations come from; output: them, or why there are none; cost:
    bootstrapping's share of the total), then `search_predict`'s."""
    config = config or DSPConfig()
    if demonstrations is not None and demonstrations_paid:
        found, spent = demonstrations, demonstrations.cost
        source = f"bootstrapped: {found.tried} of {found.offered} examples run (kept for later questions)"
    elif demonstrations is not None:
        found, source, spent = demonstrations, "given: bootstrapped earlier, its cost counted there", Cost()
    elif examples and config.demos > 0:
        found = bootstrap(generator, retriever, examples, config, rng=rng)
        source, spent = f"bootstrapped: {found.tried} of {len(examples)} examples run", found.cost
    else:
        found, spent = Bootstrap((), 0, Cost()), Cost()
        source = "zero-shot: demos=0" if examples else "zero-shot: no training examples (train)"
    result = search_predict(generator, question, retriever, config, found.demonstrations, rng=rng)
    kept = "".join(demo.text() for demo in found.demonstrations)
    summary = f"{len(found.demonstrations)} demonstrations kept" + (f"\n\n{kept}" if kept else "")
    result.trace.insert(0, TraceEntry("demonstrate", "demonstrate", source, summary, spent))
    result.cost = spent + result.cost
    return result


class BootstrapCache:
    """The registered program's demonstrations, bootstrapped once per (generator, training file,
    config) and reused by every later question: a weak map from generator to {key: Bootstrap} (a
    generator that cannot be weakly referenced bootstraps on each call). The key is the training
    file's resolved path, size and modification time and the config's repr (retriever, hops,
    samples, demos, ...). One lock: a question arriving while another bootstraps waits, then
    reuses its result."""

    def __init__(self) -> None:
        self._found: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, generator: Generator, retriever: Retriever, config: DSPConfig,
            rng: torch.Generator | None) -> tuple[Bootstrap, bool]:
        """The demonstrations for `config.train`, and whether this call bootstrapped them (its
        Cost is then this question's to count)."""
        path = Path(config.train).expanduser().resolve()
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns, repr(config))
        with self._lock:
            try:
                known = self._found.setdefault(generator, {})
            except TypeError:  # not weakly referable
                return bootstrap(generator, retriever, read_examples(config.train), config, rng=rng), True
            if key in known:
                return known[key], False
            known[key] = bootstrap(generator, retriever, read_examples(config.train), config, rng=rng)
            return known[key], True


BOOTSTRAPS = BootstrapCache()


def _dsp_program(generator: Generator, question: str, config: DSPConfig, *,
                 rng: torch.Generator | None = None) -> ChainResult:
    if config.retriever is None:
        raise ValueError("retriever is required by strategy 'dsp' (bm25:PATH | dense:PATH | URL)")
    retriever = load_retriever(config.retriever)
    if config.train is None or config.demos == 0:  # zero-shot, the trace says why
        examples = read_examples(config.train) if config.train is not None else None
        return dsp(generator, question, retriever, config, examples=examples, rng=rng)
    found, paid = BOOTSTRAPS.get(generator, retriever, config, rng)
    return dsp(generator, question, retriever, config, demonstrations=found, demonstrations_paid=paid, rng=rng)


# the tool-loop limits of ChainConfig: DSP runs no tool inside a generation, so they would do nothing
UNREAD = frozenset({"n", "params", "pattern", "max_tool_calls", "max_tool_chars"})

register(StrategySpec("dsp", "Demonstrate-Search-Predict: multi-hop retrieval, demonstrations bootstrapped from "
                      "--train, a vote over sampled answers (--retriever)", runners.chain(_dsp_program, DSPConfig),
                      **{**CHAIN, "config": DSPConfig, "set_by_run": UNREAD},
                      required_options=("retriever",)), __name__)
