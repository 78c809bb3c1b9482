"""`metagen serve`: an OpenAI-compatible server over a local model (the embedded one by default).

    metagen serve [--model PATH] [--dtype] [--threads] [--host 127.0.0.1] [--port 8000]
                  [--served-model-name NAME]
                  [--api-key-env VAR] [--max-rows 16] [--max-queue 64] [--request-timeout SECONDS]
                  [--cache-memory 256MiB | --no-prefix-cache] [--lenient]

Binds to 127.0.0.1 unless told otherwise. FastAPI and uvicorn come with the `serve` extra
(`pip install 'metagen[serve]'`); they are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys

from metagen.cli import common

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
    serve.add_argument("--max-queue", type=int, default=64,
                       help="most requests waiting for rows; beyond it HTTP 429 with Retry-After (default 64)")
    serve.add_argument("--request-timeout", type=float, default=None, metavar="SECONDS",
                       help="most seconds a request may take from its arrival, queueing included; beyond it HTTP "
                            "504 (default: no limit)")
    serve.add_argument("--cache-memory", default=None, metavar="SIZE",
                       help="keys and values the cross-request prefix cache may keep, e.g. 256MiB or 1GB "
                            "(default 256MiB with the paged KV cache of native models, none with others; 0 "
                            "disables it)")
    serve.add_argument("--no-prefix-cache", action="store_true",
                       help="no cross-request prefix cache (the same as --cache-memory 0)")
    serve.add_argument("--lenient", action="store_true",
                       help="ignore unknown request fields instead of answering 400 (listed in a response header)")
    serve.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check the options, load the model, start the engine and serve until interrupted."""
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} must be in [0, 65535]")
    if args.max_rows < 1:
        raise ValueError(f"--max-rows {args.max_rows} must be >= 1")
    if args.max_queue < 0:
        raise ValueError(f"--max-queue {args.max_queue} must be >= 0")
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise ValueError("--served-model-name must not be empty")
    if args.request_timeout is not None and not args.request_timeout > 0:
        raise ValueError(f"--request-timeout {args.request_timeout} must be > 0 seconds")
    cache_memory = None
    if args.cache_memory is not None:
        from metagen.models.prefix_cache import parse_size

        cache_memory = parse_size(args.cache_memory, "--cache-memory")
        if args.no_prefix_cache and cache_memory:
            raise ValueError(f"--no-prefix-cache contradicts --cache-memory {args.cache_memory}: give one of them")
    if args.no_prefix_cache:
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
        raise ValueError(f"metagen serve needs the serve extra ({error.name} is missing): "
                         "pip install 'metagen[serve]'") from None
    from metagen.serve.engine import Engine

    model = common.load_model(args)
    engine = Engine(model, max_rows=args.max_rows, max_queue=args.max_queue, cache_memory=cache_memory)
    engine.start()
    name = args.served_model_name or model.name
    app = create_app(model, engine, api_key=api_key, lenient=args.lenient, request_timeout=args.request_timeout,
                     served_name=name)
    print(f"metagen serve: {name} on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                    timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS)
    finally:
        engine.stop()
    return 0
