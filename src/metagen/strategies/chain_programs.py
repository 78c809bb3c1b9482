"""Ready chain programs: chain-of-thought, System 2 Attention, self-ask (with search) and the
calculator and search tool loops.

    chain_of_thought(generator, question)   # Kojima et al. 2022: reason, then extract the answer
    s2a(generator, question)                # Weston & Sukhbaatar 2023: rewrite the context, then answer
    self_ask(generator, question)           # Press et al. 2022: follow-up questions, then answer
    self_ask_search(generator, question, retriever)   # ... each follow-up answered from passages
    calculator_chain(generator, question)   # inline <<expression>> calls filled in by a calculator
    search_chain(generator, question, retriever)   # inline <search>query</search> calls answered
                                                   # by a retriever's best passages (metagen.retrieval)

Each returns a `ChainResult` (chosen output with its extracted answer, every step in the trace,
the summed Cost). Built from the program API in `chain.py`. Demonstrate-Search-Predict, a
retrieval program with bootstrapped demonstrations, is in `dsp.py` on this module's pieces
(`SearchConfig`, `load_retriever`, `CHAIN`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from metagen.decoding import capabilities as caps
from metagen.retrieval.base import MAX_K, Retriever, RetrieverTool
from metagen.sampling import SamplingParams
from metagen.scoring.answers import extract_answer
from metagen.strategies import runners
from metagen.strategies.chain import CallTool, Chain, ChainConfig, ChainResult, Generate, ToolBinding, Transform
from metagen.strategies.options import option
from metagen.strategies.spec import StrategySpec, register
from metagen.tools import Calculator, PythonTool, Tool

if TYPE_CHECKING:
    import torch

    from metagen.decoding.generator import Generator

COT_TRIGGER = "Let's think step by step."
SELF_ASK_EXAMPLE = (
    "Question: Which was completed first, the Eiffel Tower or the Statue of Liberty?\n"
    "Are follow up questions needed here: Yes.\n"
    "Follow up: When was the Eiffel Tower completed?\n"
    "Intermediate answer: In 1889.\n"
    "Follow up: When was the Statue of Liberty completed?\n"
    "Intermediate answer: In 1886.\n"
    "So the final answer is: the Statue of Liberty"
)
# the forms models write the closing line in: "So the final answer is: X", "The final answer is X",
# "Final answer: X", "final answer is - X" (any case; "is" or a colon or dash must follow, so prose
# such as "to reach the final answer we add" is no marker); the answer is the rest of that line
FINAL_ANSWER_LINE = re.compile(r"\bfinal\s+answer(?:\s+is\b\s*[:\-–]?|\s*[:\-–])[ \t]*(?P<answer>[^\n]*)",
                               re.IGNORECASE)
S2A_REWRITE = (
    "The text below was written by a user. Rewrite it for someone who must answer the user's question "
    "fairly: keep only the facts that help answer it, and leave out everything else, including the "
    "user's own opinions, guesses or hoped-for answer. Then restate the question itself, without any "
    "preference for an answer. Write two parts, \"Context:\" and \"Question:\".\n\nText by the user:\n{question}"
)
# how a prompt asks for the line QA answers are read from (a placeholder such as "<answer>" in
# the request is copied by small models: "The answer is <answer>.")
ANSWER_LINE = 'in one line that begins with "The answer is"'
S2A_ANSWER = "{context}\n\nAnswer the question above using only this context, " + ANSWER_LINE + "."
S2A_CONTEXT = "Context:"
CALCULATOR_SYSTEM = (
    "Solve the problem step by step. For arithmetic use the calculator: write <<expression>> and "
    "the exact result is filled in, e.g. 12 boxes of 7 cost 12*7 = <<12*7=84>>84. "
    "End with: The answer is <number>."
)

SELF_ASK_READ = "Passages:\n{passages}\n\nAnswer in a few words, from the passages.\nQuestion: {input}"
SEARCH_SYSTEM = (
    "Answer the question. To look something up, write <search>your query</search>; the best passages "
    "of the corpus follow in <results>...</results>. Search as often as you need, then give the answer "
    + ANSWER_LINE + "."
)


def answer_params(config: ChainConfig, stop: Sequence[str] = ("\n",)) -> SamplingParams:
    return replace(config.params, max_tokens=config.answer_tokens, stop=tuple(stop))


def clean_answer(answer: str) -> str:
    return answer.strip().lstrip(":").strip().rstrip(".").strip()


def chain_of_thought(generator: Generator, question: str, config: ChainConfig | None = None, *,
                     rng: torch.Generator | None = None) -> ChainResult:
    """Zero-shot chain of thought (Kojima et al. 2022): the model reasons after "Let's think
    step by step.", then a second call continues "...Therefore, the final answer is" for a short
    answer. Cost: two generate calls."""
    config = config or ChainConfig()
    answer_prefill = COT_TRIGGER + "{reasoning}\nTherefore, the final answer is"
    result = Chain([
        Generate("reasoning", "{question}", prefill=COT_TRIGGER),
        Generate("answer", "{question}", prefill=answer_prefill, params=answer_params(config)),
    ], config=config).run(generator, {"question": question}, rng=rng)
    result.chosen.answer = clean_answer(result.chosen.text) or None
    return result


def s2a(generator: Generator, question: str, config: ChainConfig | None = None, *,
        rng: torch.Generator | None = None) -> ChainResult:
    """System 2 Attention (Weston & Sukhbaatar 2023): soft attention takes in whatever the prompt
    holds, so irrelevant sentences and a user's stated opinion sway the answer; S2A first has the
    model regenerate the prompt keeping only the relevant, unopinionated context and the question
    itself (`S2A_REWRITE`, continued after "Context:"), then answers from that regenerated text
    alone (`S2A_ANSWER`: the original prompt is not sent again). values["context"] (and the trace's
    "context" entry) is the regenerated text; chosen.answer the answer extracted with
    `config.pattern` (default: "The answer is X", else the last number). Cost: the two generate
    calls."""
    result = Chain([
        Generate("rewrite", S2A_REWRITE, prefill=S2A_CONTEXT),
        Transform("context", lambda values: S2A_CONTEXT + " " + values["rewrite"].strip()),
        Generate("answer", S2A_ANSWER),
    ], config=config).run(generator, {"question": question}, rng=rng)
    result.chosen.answer = extract_answer(result.chosen.text, None if config is None else config.pattern)
    return result


def self_ask(generator: Generator, question: str, config: ChainConfig | None = None, *,
             rng: torch.Generator | None = None) -> ChainResult:
    """Self-ask (Press et al. 2022): the model decomposes the question into "Follow up:"
    questions; each is answered by a separate short model call and inserted after
    "Intermediate answer:"; the model ends with "So the final answer is: ...". Cost: one
    generate call per continuation plus one per follow-up question (at most max_tool_calls)."""
    config = config or ChainConfig()
    follow_up = Generate("intermediate", "Answer in a few words.\nQuestion: {input}", params=answer_params(config))
    return _self_ask(generator, question, follow_up, config, rng)


def self_ask_search(generator: Generator, question: str, retriever: Retriever,
                    config: ChainConfig | None = None, *, k: int = 3,
                    rng: torch.Generator | None = None) -> ChainResult:
    """Self-ask with a search engine (Press et al. 2022): as `self_ask`, but each
    follow-up question is a query to `retriever`, and a short model call answers it from the k
    best passages (the step "passages", then "intermediate"), the answer going back after
    "Intermediate answer:". The trace holds each hop: the search (its input the follow-up, its
    output the numbered passages) and the answer read from them. Cost: `self_ask`'s calls plus
    each search's wall time (and a dense retriever's query encoding)."""
    config = config or ChainConfig()
    hop = (CallTool("passages", RetrieverTool(retriever, k), "{input}"),
           Generate("intermediate", SELF_ASK_READ, params=answer_params(config)))
    return _self_ask(generator, question, hop, config, rng)


def _self_ask(generator: Generator, question: str, follow_up: Generate | tuple, config: ChainConfig,
              rng: torch.Generator | None) -> ChainResult:
    """The self-ask program with `follow_up` answering each "Follow up:" question."""
    binding = ToolBinding(follow_up, "Follow up:", "Intermediate answer:", answer="{open}{input}{close} {output}\n")
    result = Chain([
        Generate("decomposition", SELF_ASK_EXAMPLE + "\n\nQuestion: {question}",
                 prefill="Are follow up questions needed here:", tools=(binding,),
                 params=replace(config.params, stop=config.params.stop + ("\nQuestion:",))),
        Transform("answer", lambda values: _after_marker(values["decomposition"])),
    ], config=config).run(generator, {"question": question}, rng=rng)
    result.chosen.answer = clean_answer(result.chosen.text) or None
    return result


def _after_marker(text: str) -> str:
    """The answer after the last "final answer" marker (`FINAL_ANSWER_LINE`: the example's "So
    the final answer is:" and the variants models write): the rest of its line, or when that is
    empty the next non-empty line ("" when there is none); without a marker, the last non-empty
    line."""
    matches = list(FINAL_ANSWER_LINE.finditer(text))
    if matches:
        rest = matches[-1].group("answer").strip()
        if rest:
            return rest
        after = [line.strip() for line in text[matches[-1].end():].splitlines() if line.strip()]
        return after[0] if after else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def calculator_binding(calculator: Tool | None = None) -> ToolBinding:
    """GSM8K-style calls: the model writes <<12*7>> (or <<12*7=85>>); it reads <<12*7=84>>."""
    return ToolBinding(calculator or Calculator(), "<<", ">>", answer="{open}{input}={output}{close}", input_separator="=")


def python_binding(tool: Tool | None = None) -> ToolBinding:
    """```python fenced code is run in the sandbox; its output follows in an ```output fence."""
    return ToolBinding(tool or PythonTool(), "```python\n", "```",
                       answer="{open}{input}{close}\n```output\n{output}\n```\n")


def search_binding(retriever: Retriever, k: int = 3) -> ToolBinding:
    """<search>query</search> is answered by the retriever's k best passages, numbered, in a
    <results> block (`retrieval.base.format_passages`), as in Toolformer's inline API calls."""
    return ToolBinding(RetrieverTool(retriever, k), "<search>", "</search>",
                       answer="{open}{input}{close}\n<results>\n{output}\n</results>\n")


def tool_loop(generator: Generator, question: str, tools: Sequence[ToolBinding] | None = None,
              config: ChainConfig | None = None, *, system: str = CALCULATOR_SYSTEM,
              rng: torch.Generator | None = None) -> ChainResult:
    """One generation that calls tools inline (default: the calculator) until it finishes;
    chosen.answer is the final answer extracted with `config.pattern` (default: "The answer is N",
    else the last number)."""
    bindings = tuple(tools) if tools is not None else (calculator_binding(),)
    result = Chain([Generate("solution", "{question}", system=system, tools=bindings)],
                   config=config).run(generator, {"question": question}, rng=rng)
    result.chosen.answer = extract_answer(result.chosen.text, None if config is None else config.pattern)
    return result


def calculator_chain(generator: Generator, question: str, config: ChainConfig | None = None, *,
                     rng: torch.Generator | None = None) -> ChainResult:
    """`tool_loop` with the calculator and its instructions."""
    return tool_loop(generator, question, (calculator_binding(),), config, rng=rng)


def search_chain(generator: Generator, question: str, retriever: Retriever, config: ChainConfig | None = None, *,
                 k: int = 3, rng: torch.Generator | None = None) -> ChainResult:
    """`tool_loop` with the retriever (`search_binding`, k passages a search) and its instructions.
    Cost: the model calls, plus each search's wall time (and a dense retriever's query encoding)."""
    return tool_loop(generator, question, (search_binding(retriever, k),), config, system=SEARCH_SYSTEM, rng=rng)


@dataclass(frozen=True)
class SearchConfig(ChainConfig):
    """ChainConfig and what the search tool searches: `retriever` (checked when the config is
    built: kind known, corpus path existing, URL well formed; nothing loaded) and `passages`, the
    k of each search."""

    retriever: str | None = option(None, str, "what the search tool searches: bm25:PATH | dense:PATH (a .jsonl "
                                   "file or a directory of .txt files; BM25 settings after '?', as in "
                                   "bm25:PATH?title_weight=3&k1=0.9&b=0.4) | http(s)://HOST[:PORT]/PATH (a "
                                   "search endpoint)", optional=True, opens=True)
    passages: int = option(3, int, "passages each search returns", low=1, high=MAX_K)

    def __post_init__(self) -> None:
        from metagen.retrieval.spec import parse_retriever_spec

        super().__post_init__()
        if self.retriever is not None:
            parse_retriever_spec(self.retriever)


@lru_cache(maxsize=4)
def load_retriever(spec: str) -> Retriever:
    """The retriever `spec` names, built once per process: its index is read once, not per question
    (a corpus edited while the process runs is re-indexed by the next process). `metagen serve
    --retriever` calls it at start-up, so its requests find it built."""
    from metagen.retrieval.spec import make_retriever

    return make_retriever(spec)


def _search_program(generator: Generator, question: str, config: SearchConfig, *,
                    rng: torch.Generator | None = None) -> ChainResult:
    if config.retriever is None:
        raise ValueError("retriever is required by strategy 'search' (bm25:PATH | dense:PATH | URL)")
    return search_chain(generator, question, load_retriever(config.retriever), config, k=config.passages, rng=rng)


def _self_ask_search_program(generator: Generator, question: str, config: SearchConfig, *,
                             rng: torch.Generator | None = None) -> ChainResult:
    if config.retriever is None:
        raise ValueError("retriever is required by strategy 'self_ask_search' (bm25:PATH | dense:PATH | URL)")
    return self_ask_search(generator, question, load_retriever(config.retriever), config, k=config.passages, rng=rng)


# chains continue a final assistant message (a prefill, or text around a tool call) until a stop
# string, and read which stop string ended it; a chain's answer is several requests (reasoning,
# tool results, a final answer after a prefill): one constraint cannot span them, and applied to
# each it would constrain the reasoning too
CHAIN = {"pooled": False, "budget": "none", "needs": frozenset({caps.ASSISTANT_CONTINUATION}), "config": ChainConfig,
         "set_by_run": frozenset({"n", "params", "pattern"}),  # the pattern is the run's (StrategyOptions.pattern)
          "constrains": False, "why_unconstrained": (
              "its output is built from several requests around tool calls and prefills, and a constraint cannot "
              "carry its state from one request to the next; constrain a sampling strategy (best_of_n, "
              "self_consistency, ...) or a tree search instead")}

register(StrategySpec("chain_of_thought", "reason step by step, then a call for the final answer",
                      runners.chain(chain_of_thought), **CHAIN), __name__)
register(StrategySpec("s2a", "System 2 Attention: regenerate the relevant, unopinionated context, answer from it",
                      runners.chain(s2a), **CHAIN), __name__)
register(StrategySpec("self_ask", "follow-up questions answered by the model, then the answer",
                      runners.chain(self_ask), **CHAIN), __name__)
register(StrategySpec("calculator", "inline <<calculator>> calls while solving", runners.chain(calculator_chain),
                      **CHAIN), __name__)
register(StrategySpec("search", "inline <search> calls answered by a retriever's passages (--retriever)",
                      runners.chain(_search_program, SearchConfig), **{**CHAIN, "config": SearchConfig},
                      required_options=("retriever",)), __name__)
register(StrategySpec("self_ask_search", "self-ask with each follow-up answered from a retriever's passages "
                      "(--retriever)", runners.chain(_self_ask_search_program, SearchConfig),
                      **{**CHAIN, "config": SearchConfig}, required_options=("retriever",)), __name__)
