"""The options of commands that can run on a remote OpenAI-compatible server instead of the
local model: --backend URL[,URL...], --served-model, --engine, --api-key-env, --parameters,
--tokenizer (and --concurrency for `metagen eval`). --engine is declared once here
(`add_engine_option`, its choices the engine table's names) and read by `metagen serve`'s proxy
mode too.

Text prompts on a --backend go to the server's /v1/chat/completions by default (the server
applies the model's chat template; `OpenAIGenerator`'s chat=None), unless --tokenizer names a
tokenizer without a chat template; --no-chat sends them raw to /v1/completions.

With --backend, the options that only configure the local model (--model, --dtype, --kv-dtype,
--activations, --threads, --speculative, --beam-width) are refused with the reason; without it, the remote-only options
are. `make_generator` builds the generator once: one URL gives an `OpenAIGenerator`, several
a fleet over them (`metagen.remote.connect`).
"""

from __future__ import annotations

import argparse

LOCAL_ONLY = ("model", "dtype", "kv-dtype", "activations", "threads", "speculative", "beam-width")
REMOTE_ONLY = ("served-model", "engine", "api-key-env", "parameters", "tokenizer")


def add_backend_options(parser: argparse.ArgumentParser, concurrency: bool = False, repeat: bool = False) -> None:
    """--backend and the options that configure it; `concurrency`: also --concurrency K;
    `repeat`: each --backend is one model of a sweep (`metagen eval`), and --served-model,
    --engine, --parameters and --tokenizer are given once per --backend, in the same order (lists)."""
    group = parser.add_argument_group("remote backend (an OpenAI-compatible server: vLLM, SGLang, llama.cpp, "
                                      "or any other)")
    several = {"action": "append"} if repeat else {}
    per = " (once per --backend, in order)" if repeat else ""
    group.add_argument("--backend", default=None, metavar="URL[,URL...]", **several,
                       help="API root(s) of OpenAI-compatible server(s), e.g. http://host:8000/v1, "
                            + ("serving one model of the sweep; repeat it for several models (URLs joined by "
                               "commas: replicas of one model)" if repeat else "used instead of the local model"))
    group.add_argument("--served-model", default=None, metavar="NAME", **several,
                       help="the model id on the server (default: the only one it serves" +
                            ("; 'auto' says so for one --backend among several)" if repeat else ")"))
    add_engine_option(group, repeat)
    group.add_argument("--api-key-env", default=None, metavar="VAR",
                       help="environment variable holding the API key (default OPENAI_API_KEY)")
    group.add_argument("--parameters", type=parse_parameters, default=None, metavar="N", **several,
                       help="the served model's parameters a token runs through (all but the input embedding "
                            "table; e.g. 7e9 or 1.5B), for FLOPs estimated as 2·N per prompt and generated token, "
                            "attention omitted" + per + ("; 'unknown' for none" if repeat else "") +
                            "; default unknown FLOPs")
    group.add_argument("--tokenizer", default=None, metavar="PATH", **several,
                       help="GGUF file or HF directory whose tokenizer gives token ids when the server "
                            "returns none" + per + ("; 'none' for none" if repeat else ""))
    if concurrency:
        group.add_argument("--concurrency", type=int, default=1, metavar="K",
                           help="problems evaluated at once (default 1; > 1 needs --backend" +
                                (", and applies to the --backend models: local ones run one problem at a time)"
                                 if repeat else ")"))


def add_engine_option(group, repeat: bool = False) -> None:
    """--engine NAME: the serving engine of a --backend, for servers /v1/models does not identify;
    choices: the engine table's names and "auto". `repeat`: once per --backend (a list)."""
    from metagen.remote.engines import ENGINES, GENERIC

    group.add_argument("--engine", default=None, choices=["auto", *ENGINES], metavar="NAME",
                       **({"action": "append"} if repeat else {}),
                       help=f"the server's engine, one of {', '.join(ENGINES)} (what metagen sends it and what it "
                            f"refuses: docs/engines); default auto: from its /v1/models owned_by, and a server not "
                            f"recognised there (Ollama, LM Studio, TGI, a gateway) runs as the generic "
                            f"{GENERIC!r} shape, with a warning naming what that shape cannot do" +
                            (" (once per --backend, in order; 'auto' for one among several)" if repeat else ""))


def check_backend_options(args: argparse.Namespace) -> None:
    """ValueError for local-model options with --backend, and remote options without it."""
    concurrency = getattr(args, "concurrency", 1)
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"--concurrency {concurrency} is out of range: must be >= 1")
    if args.backend is None:
        remote = [name for name in REMOTE_ONLY if getattr(args, name.replace("-", "_")) is not None]
        if remote:
            raise ValueError(f"{', '.join('--' + name for name in remote)} configure a remote server: add --backend URL")
        if concurrency is not None and concurrency > 1:
            raise ValueError(f"--concurrency {concurrency} needs --backend: the local model runs one batch "
                             "at a time (it is not thread-safe)")
        return
    local = [name for name in LOCAL_ONLY if getattr(args, name.replace("-", "_"), None) is not None]
    if local:
        raise ValueError(f"{', '.join('--' + name for name in local)} configure the local model, which "
                         "--backend replaces: the server's model, precision and decoding are its own")
    backend_urls(args.backend)


_SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parameter_count(flag: str):
    """The argparse type of a parameter-count flag: `parse_parameters`, its errors naming `flag`."""

    def parse(text: str) -> float | None:
        return parse_parameters(text, flag)

    return parse


def parse_parameters(text: str, flag: str = "--parameters") -> float | None:
    """--parameters: "7e9", "7000000000", "1.5B", "135M", "0.5b" -> a positive count; "unknown"
    -> None. ValueError naming `flag` and what it accepts (argparse reports it as a usage
    error of the flag)."""
    value = text.strip()
    if value.lower() == "unknown":
        return None
    scale = _SUFFIXES.get(value[-1:].lower(), 1.0) if value else 1.0
    number = value[:-1] if scale != 1.0 else value
    try:
        count = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag} {text!r} is not a parameter count: give a number such as "
                                         "7e9, 1.5B or 135M (K, M, B/G, T suffixes), or 'unknown'") from None
    if not (count > 0 and count != float("inf")):
        raise argparse.ArgumentTypeError(f"{flag} {text!r} is out of range: must be a positive finite count")
    return count


def backend_urls(text: str) -> list[str]:
    """"http://a/v1,http://b/v1" -> ["http://a/v1", "http://b/v1"]; ValueError naming a bad one."""
    urls = [url.strip().rstrip("/") for url in text.split(",") if url.strip()]
    if not urls:
        raise ValueError(f"--backend {text!r} names no URL: give http(s)://host:port/v1[,...]")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--backend URL {url!r} must start with http:// or https:// (e.g. http://host:8000/v1)")
    repeated = sorted({url for url in urls if urls.count(url) > 1})
    if repeated:
        raise ValueError(f"--backend names {', '.join(repeated)} more than once")
    return urls


def load_tokenizer(path: str):
    """The tokenizer of a GGUF file or an HF directory (FileNotFoundError when absent)."""
    from pathlib import Path

    from metagen.models.tokenizer import Tokenizer

    source = Path(path)
    if not source.exists():
        raise FileNotFoundError(f"--tokenizer {path}: no such file or directory")
    if source.is_dir():
        return Tokenizer.from_hf_dir(source)
    import gguf

    return Tokenizer.from_gguf(gguf.GGUFReader(str(source)))


def make_generator(args: argparse.Namespace, chat: bool | None = None):
    """The remote generator of --backend and its options (one server, or a fleet over several);
    chat: --chat / --no-chat (None: the generator's default, the server's chat endpoint unless
    --tokenizer has no template)."""
    return connect_backend(args.backend, args.served_model, args.parameters, args.tokenizer, args.api_key_env, chat,
                           args.engine)


def connect_backend(urls: str, served_model: str | None, parameters: float | None, tokenizer: str | None,
                    api_key_env: str | None, chat: bool | None = None, engine: str | None = None):
    """The remote generator of one --backend value (one server, or a fleet over several URLs);
    chat and engine None: `OpenAIGenerator`'s defaults (see the module docstring)."""
    from metagen.remote import connect

    options = {"model": served_model, "chat": chat, "parameter_count": parameters, "engine": engine or "auto",
               "tokenizer": load_tokenizer(tokenizer) if tokenizer is not None else None}
    if api_key_env is not None:
        options["api_key_env"] = api_key_env
    return connect(backend_urls(urls), **options)
