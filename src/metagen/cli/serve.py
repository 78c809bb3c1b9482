"""`metagen serve`: an OpenAI-compatible server over a local model (the embedded one by default),
or over remote OpenAI-compatible servers (proxy mode).

    metagen serve [--model PATH] [--dtype] [--kv-dtype] [--threads] [--host 127.0.0.1] [--port 8000]
                  [--served-model-name NAME]
                  [--api-key-env VAR] [--max-rows 16] [--max-queue 64] [--max-n 128] [--request-timeout SECONDS]
                  [--cache-memory 256MiB | --no-prefix-cache] [--prefill-chunk 256] [--lenient]
                  [--retriever bm25:PATH | dense:PATH | URL]
                  [--contrastive AMATEUR [--alpha] [--amateur-temperature] [--beta]
                   | --dexperts EXPERT,ANTI [--dexperts-alpha]
                   | --speculative DRAFTER [--num-draft-tokens] [--verify] [--adaptive-draft] [--tree-widths]
                     [--tree-nodes] [--draft-corpus]]
    metagen serve --backend URL [URL ...] [--engine NAME] [--backend-api-key-env VAR] [--backend-concurrency K]
                  [--backend-stall-seconds 5] [--tokenizer PATH] [--host] [--port] [--served-model-name]
                  [--api-key-env] [--max-rows] [--max-n] [--request-timeout] [--lenient] [--retriever]

Proxy mode (--backend) runs no model: requests and strategies go to the servers at the URLs (vLLM,
SGLang, llama.cpp's server, another metagen serve; one fleet when several) through the remote
generator (metagen.serve.proxy); the options of the local model and engine are refused with it.
--engine names the backends' engine (declared with the other remote options, `cli/backend.py`):
by default it is read from their /v1/models, and a server not recognised there is served as the
generic OpenAI shape, with a warning.

--contrastive and --dexperts (declared with `generate`'s, cli/contrastive.py and cli/mixing.py)
make the server decode every request with that combiner, the --model as the expert (or base):
its companion models keep rows in the engine next to the model's (serve/companions.py), and
/v1/models and /health name it under "decoding". Their caches are not the prefix cache's, so
such a server has none (--cache-memory above 0 is refused).

--retriever names the corpus (or search endpoint) the search strategies search (search,
self_ask_search, dsp: `"metagen": {"strategy": "dsp"}`); it is checked before any model loads and
built once at start-up (a BM25 or dense index read or made), and every such request searches it. A
request cannot name a corpus, a training file or a URL of its own (`serve/strategy_request.py`),
and without --retriever those strategies are refused.

--speculative DRAFTER (declared with `generate`'s, cli/speculative.py) decodes every request
speculatively inside the engine's continuous batching (serve/speculation.py): each request drafts
with its own copy of the drafter (ngram, recycling, rasd, stand, medusa; or draft models:
early-exit, quantized, model:PATH, tree, spectr, dyspec, rasd-tree, s2d, pearl, each request's
copy keeping its own draft caches of the request's rows, counted in the admission check; pearl's
rounds run serially, the engine's one thread running every forward), one forward scores every
row's draft (with the hidden states Medusa heads read), and each request verifies its own with
--verify's rule. --speculative with --contrastive or --dexperts is refused before any model loads.

Binds to 127.0.0.1 unless told otherwise. FastAPI and uvicorn come with the `serve` extra
(the `serve` extra: `pip install -e '.[serve]'` in a checkout); they are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys

from metagen.cli import common
from metagen.cli.backend import add_engine_option
from metagen.cli.contrastive import add_contrastive_options, contrastive_settings, make_combiner
from metagen.cli.mixing import add_dexperts_options, dexperts_settings, make_mixing_combiner
from metagen.cli.speculative import OPTIONS as SPECULATIVE_OPTIONS
from metagen.cli.speculative import add_speculative_options, make_drafter, speculative_options

GRACEFUL_SHUTDOWN_SECONDS = 5  # on SIGTERM / Ctrl-C, open streams get this long before they are cut


def add_parser(commands) -> None:
    serve = commands.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    common.add_model_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--served-model-name", default=None, metavar="NAME",
                       help="the model id clients use (default: the model's own name)")
    serve.add_argument("--api-key-env", default=None, metavar="VAR",
                       help="require `Authorization: Bearer <key>` with the key read from environment variable VAR")
    serve.add_argument("--max-rows", type=int, default=16,
                       help="most rows (sum of n over requests) decoded together (default 16)")
    serve.add_argument("--max-queue", type=int, default=None,
                       help="most requests waiting for rows; beyond it HTTP 429 with Retry-After (default 64)")
    serve.add_argument("--max-n", type=int, default=None,
                       help="most completions (n) a request may ask for, and the bound on every strategy option "
                            "that counts work: metagen.n, widths, expansions, iterations, steps (default 128)")
    serve.add_argument("--request-timeout", type=float, default=None, metavar="SECONDS",
                       help="most seconds a request may take from its arrival, queueing included; beyond it HTTP "
                            "504 (default: no limit)")
    serve.add_argument("--cache-memory", default=None, metavar="SIZE",
                       help="keys and values the cross-request prefix cache may keep, e.g. 256MiB or 1GB "
                            "(default 256MiB with the paged KV cache of native models, none with others; 0 "
                            "disables it)")
    serve.add_argument("--no-prefix-cache", action="store_true",
                       help="no cross-request prefix cache (the same as --cache-memory 0)")
    serve.add_argument("--prefill-chunk", type=int, default=None, metavar="TOKENS",
                       help="most prompt tokens prefilled per engine step; a longer prompt is prefilled over "
                            "several steps, between which running streams decode (default 256)")
    serve.add_argument("--lenient", action="store_true",
                       help="ignore unknown request fields instead of answering 400 (listed in a response header)")
    serve.add_argument("--retriever", default=None, metavar="SPEC",
                       help="what the search strategies (search, self_ask_search, dsp) search: bm25:PATH | dense:PATH "
                            "(a .jsonl file or a directory of .txt files) | http(s)://HOST[:PORT]/PATH; built once at "
                            "start-up (default: none, and those strategies are refused)")
    add_contrastive_options(serve)
    add_dexperts_options(serve)
    add_speculative_options(serve, served=True)
    proxy = serve.add_argument_group("proxy mode (remote OpenAI-compatible servers instead of a local model)")
    proxy.add_argument("--backend", nargs="+", default=None, metavar="URL",
                       help="API root(s) of the servers to forward to, e.g. http://127.0.0.1:8001/v1 (several: one "
                            "fleet, balanced, with failover)")
    add_engine_option(proxy)
    proxy.add_argument("--backend-api-key-env", default=None, metavar="VAR",
                       help="environment variable holding the backends' API key (default: none sent)")
    proxy.add_argument("--backend-concurrency", type=int, default=None, metavar="K",
                       help="requests in flight on one backend at most (default 4; fewer where the backend reports "
                            "fewer slots, as llama.cpp's server does); the rest wait in the proxy")
    proxy.add_argument("--backend-stall-seconds", type=float, default=None, metavar="SECONDS",
                       help="a backend whose request in flight has had no byte for this long, while the others "
                            "answer, gets no new request until it answers again (default 5)")
    proxy.add_argument("--tokenizer", default=None, metavar="PATH",
                       help="GGUF file or HF directory with the served model's tokenizer: token ids where the "
                            "backends return none, chat prompts of step searches")
    serve.set_defaults(run=run)


LOCAL_ONLY = ("model", "dtype", "kv_dtype", "activations", "threads", "max_queue", "cache_memory", "no_prefix_cache",
              "prefill_chunk", "contrastive", "alpha", "amateur_temperature", "beta", "dexperts", "dexperts_alpha",
              "speculative", *SPECULATIVE_OPTIONS)
PROXY_ONLY = ("engine", "backend_api_key_env", "backend_concurrency", "backend_stall_seconds", "tokenizer")
BACKEND_CONCURRENCY = 4  # requests in flight per backend without --backend-concurrency
PROXY_RETRIES = 1  # a failing backend is retried once, then the fleet fails over to another
PROXY_TIMEOUT = 600.0  # seconds per backend request without --request-timeout
HEALTH_INTERVAL = 10.0  # seconds between health checks of the live backends


def run(args: argparse.Namespace) -> int:
    """Check the options, load the model, start the engine and serve until interrupted."""
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} must be in [0, 65535]")
    if args.max_rows < 1:
        raise ValueError(f"--max-rows {args.max_rows} must be >= 1")
    if args.backend is not None:
        given = [name for name in LOCAL_ONLY if getattr(args, name) not in (None, False)]
        if given:
            raise ValueError(f"{', '.join('--' + name.replace('_', '-') for name in given)} configure the local model "
                             "and engine, which --backend replaces")
    else:
        given = [name for name in PROXY_ONLY if getattr(args, name) is not None]
        if given:
            raise ValueError(f"{', '.join('--' + name.replace('_', '-') for name in given)} configure proxy mode: "
                             "add --backend URL")
    if args.backend_concurrency is not None and args.backend_concurrency < 1:
        raise ValueError(f"--backend-concurrency {args.backend_concurrency} must be >= 1")
    if args.backend_stall_seconds is not None and not 0 < args.backend_stall_seconds < float("inf"):
        raise ValueError(f"--backend-stall-seconds {args.backend_stall_seconds} must be > 0 seconds")
    if args.max_queue is None:
        args.max_queue = 64
    if args.max_queue < 1:  # a request waits in the queue before it is admitted: 0 would refuse them all
        raise ValueError(f"--max-queue {args.max_queue} must be >= 1")
    if args.max_n is None:
        from metagen.serve.body import DEFAULT_MAX_N

        args.max_n = DEFAULT_MAX_N
    if args.max_n < 1:
        raise ValueError(f"--max-n {args.max_n} must be >= 1")
    if args.prefill_chunk is not None and args.prefill_chunk < 1:
        raise ValueError(f"--prefill-chunk {args.prefill_chunk} must be >= 1 (prompt tokens per engine step)")
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise ValueError("--served-model-name must not be empty")
    if args.request_timeout is not None and not args.request_timeout > 0:
        raise ValueError(f"--request-timeout {args.request_timeout} must be > 0 seconds")
    cache_memory = None
    if args.cache_memory is not None:
        from metagen.sizes import parse_size

        cache_memory = parse_size(args.cache_memory, "--cache-memory")
        if args.no_prefix_cache and cache_memory:
            raise ValueError(f"--no-prefix-cache contradicts --cache-memory {args.cache_memory}: give one of them")
    if args.no_prefix_cache:
        cache_memory = 0
    if args.retriever is not None:
        from metagen.retrieval.spec import parse_retriever_spec

        parse_retriever_spec(args.retriever, "--retriever")
    combiner = _combiner_settings(args)
    speculative = None if args.backend is not None else speculative_options(args)
    if speculative is not None and combiner is not None:
        raise ValueError(f"--speculative {args.speculative} cannot be combined with --{combiner[0]}: speculation "
                         "verifies the model's own logits, and the combiner's companion models would have to score "
                         "every draft too; serve one or the other")
    if combiner is not None:
        if cache_memory:
            raise ValueError(f"--cache-memory {args.cache_memory} cannot be combined with --{combiner[0]}: the prefix "
                             "cache holds the model's keys and values only, not its companion models' (a server "
                             "with a combiner has no prefix cache)")
        cache_memory = 0
    api_key = None
    if args.api_key_env is not None:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise ValueError(f"--api-key-env {args.api_key_env}: that environment variable is unset or empty")
    try:
        import uvicorn

        from metagen.serve.app import create_app
    except ImportError as error:
        from metagen.extras import install_line

        raise ValueError(f"metagen serve needs the 'serve' extra ({error.name} is missing): "
                         f"{install_line('serve')}") from None
    if args.retriever is not None:  # built now, once: every search request finds it ready
        from metagen.strategies.chain_programs import load_retriever

        load_retriever(args.retriever)
    backend = _proxy(args) if args.backend is not None else _local(args, cache_memory, combiner, speculative)
    name = backend.served_name
    app = create_app(backend, api_key=api_key, lenient=args.lenient, request_timeout=args.request_timeout,
                     max_n=args.max_n, retriever=args.retriever)
    print(f"metagen serve: {name} on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                    timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS)
    finally:
        backend.close()
    return 0


def _combiner_settings(args: argparse.Namespace) -> tuple[str, dict] | None:
    """(flag, settings) of --contrastive or --dexperts (checked, nothing loaded), or None;
    ValueError when both are given."""
    contrastive, dexperts = contrastive_settings(args), dexperts_settings(args)
    if contrastive is not None and dexperts is not None:
        raise ValueError("--dexperts cannot be combined with --contrastive: one way of mixing models at a time")
    if contrastive is not None:
        return "contrastive", contrastive
    return None if dexperts is None else ("dexperts", dexperts)


def _local(args: argparse.Namespace, cache_memory: int | None, combiner: tuple[str, dict] | None,
           speculative: dict | None):
    """The local model (and its combiner's companion models, or its drafter) behind a started engine."""
    from metagen.serve.engine import DEFAULT_PREFILL_CHUNK, Engine
    from metagen.serve.local import LocalBackend

    model = common.load_model(args)
    if combiner is not None:
        flag, settings = combiner
        combiner = (make_combiner if flag == "contrastive" else make_mixing_combiner)(settings, model, args)
    drafter = None if speculative is None else make_drafter(speculative, model)
    engine = Engine(model, max_rows=args.max_rows, max_queue=args.max_queue, cache_memory=cache_memory,
                    prefill_chunk=args.prefill_chunk or DEFAULT_PREFILL_CHUNK, combiner=combiner, drafter=drafter,
                    speculative=None if speculative is None else speculative["config"])
    engine.start()
    return LocalBackend(model, engine, args.served_model_name)


def _proxy(args: argparse.Namespace):
    """The fleet over --backend, probed now (an error naming every backend when none answers)."""
    from metagen.cli.backend import backend_urls, load_tokenizer
    from metagen.remote import FleetGenerator
    from metagen.remote.pool import STALL_SECONDS
    from metagen.serve.proxy import ProxyBackend

    urls = backend_urls(",".join(args.backend))
    remote = FleetGenerator(urls, engine=args.engine or "auto",
                            tokenizer=load_tokenizer(args.tokenizer) if args.tokenizer else None,
                            api_key_env=args.backend_api_key_env or "", timeout=args.request_timeout or PROXY_TIMEOUT,
                            max_retries=PROXY_RETRIES, health_interval=HEALTH_INTERVAL,
                            stall_seconds=args.backend_stall_seconds or STALL_SECONDS,
                            max_concurrency_per_endpoint=args.backend_concurrency or BACKEND_CONCURRENCY)
    try:
        return ProxyBackend(remote, served_name=args.served_model_name, max_rows=args.max_rows)
    except BaseException:
        remote.close()
        raise
