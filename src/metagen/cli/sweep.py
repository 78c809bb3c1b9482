"""The models of one `metagen eval` sweep: every --model (a GGUF file, an HF directory, a hub
name OWNER/NAME[:QUANT] or `embedded`) and every --backend (one served model each; its
--served-model, --engine, --parameters and --tokenizer given once per --backend, in order), as
`config.ModelRun`s in the order given, local models first. --chat / --no-chat applies to every
model alike (`model_runs`' local_chat and remote_chat).

Each model gets a short label, unique in the sweep, that names its points and files its units in
results.jsonl: a file's stem or a directory's name, a served model's id. Labels that collide
take a longer form — the parent directory before the name, the server's host:port after the id
— so a label does not depend on which other models run (a later run of a subset or superset
files every model under the same label); labels still equal after that are refused. Local
models are loaded one at a time, when their turn comes, and freed after; hub models are
downloaded (or found in the hub cache) and remote generators connected (and their served model
probed, for its id) before any local model loads, so a wrong name fails the sweep at once.

A token-level decoder (--contrastive, --dexperts, --entropy-adaptive, --adadec; `cli/decoders.py`)
applies to every local model, and its label follows the model's: "NAME + contrastive(...)"; a
companion given as a hub name is downloaded up front too.
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager, nullcontext

from metagen.cli import backend, common

EMBEDDED = common.EMBEDDED
LOCAL_OPTIONS = ("dtype", "kv-dtype", "activations", "threads")
PER_BACKEND = (("served-model", "auto"), ("engine", "auto"), ("parameters", None), ("tokenizer", "none"))


def check(args: argparse.Namespace) -> None:
    """ValueError naming the flag, before anything is loaded or connected: --concurrency, local
    options without a local model, per-backend options without --backend or not given once per
    --backend, and each --backend's URLs."""
    if args.concurrency is not None and args.concurrency < 1:
        raise ValueError(f"--concurrency {args.concurrency} is out of range: must be >= 1")
    backends = args.backend or []
    if not backends:
        given = [f"--{name}" for name, _ in PER_BACKEND if getattr(args, name.replace("-", "_")) is not None]
        given += ["--api-key-env"] if args.api_key_env is not None else []
        if given:
            raise ValueError(f"{', '.join(given)} configure a remote server: add --backend URL")
        if args.concurrency > 1:
            raise ValueError(f"--concurrency {args.concurrency} needs --backend: the local model runs one batch "
                             "at a time (it is not thread-safe)")
    elif not args.model:
        local = [f"--{name}" for name in LOCAL_OPTIONS if getattr(args, name.replace("-", "_"), None) is not None]
        if local:
            raise ValueError(f"{', '.join(local)} configure a local model, and no --model is given: the "
                             "servers' models, precision and decoding are their own")
    for name, _ in PER_BACKEND:
        values = getattr(args, name.replace("-", "_")) or []
        if values and len(values) != len(backends):
            raise ValueError(f"--{name} is given {len(values)} time(s) for {len(backends)} --backend: give it once "
                             "per --backend, in the same order, or not at all")
    for urls in backends:
        backend.backend_urls(urls)
    for path in args.model or []:
        common.check_model_source("model", path)


def model_runs(args: argparse.Namespace, local_chat: bool | None = None,
               remote_chat: bool | None = None, decoder=None) -> tuple[list, list]:
    """(runs, remote generators to close) of a checked `args` (see `check`); local_chat /
    remote_chat: the generators' `chat` setting (None: their default); `decoder`: the
    `decoders.SweepDecoder` every local model decodes with (None: its own), named after its
    label ("NAME + contrastive(...)")."""
    from metagen.eval.config import ModelRun
    from metagen.models.hub import resolve

    paths = list(args.model or ([] if args.backend else [EMBEDDED]))
    for path in paths + (decoder.model_specs if decoder is not None else []):
        if path != EMBEDDED:
            resolve(path)  # a hub name's files into the hub cache now; its turn loads them from there
    remotes = []
    try:
        for index, urls in enumerate(args.backend or []):
            served, engine, parameters, tokenizer = (_per_backend(args, name, index, absent)
                                                     for name, absent in PER_BACKEND)
            remotes.append(backend.connect_backend(urls, served, parameters, tokenizer, args.api_key_env,
                                                   remote_chat, engine))
        names = [common.local_names(path) for path in paths] + [_remote_names(remote) for remote in remotes]
    except BaseException:
        for remote in remotes:
            remote.close()
        raise
    labels = _labels(names, [f"--model {path}" for path in paths] + [f"--backend {urls}" for urls in args.backend or []])
    suffix = f" + {decoder.label}" if decoder is not None else ""
    runs = [ModelRun(label + suffix, _loader(args, path, local_chat, decoder), concurrency=1)
            for label, path in zip(labels, paths)]
    runs += [ModelRun(label, lambda remote=remote: nullcontext((remote, None)))
             for label, remote in zip(labels[len(paths):], remotes)]
    return runs, remotes


def _per_backend(args: argparse.Namespace, name: str, index: int, absent: str | None):
    values = getattr(args, name.replace("-", "_"))
    value = values[index] if values else None
    return None if value == absent else value


def _remote_names(remote) -> tuple[str, str]:
    """(short, long) labels of a served model: its id, and that @ the first server's host:port."""
    from urllib.parse import urlsplit

    identity = remote.served_identity()
    return identity["name"], f"{identity['name']}@{urlsplit(identity['base_urls'][0]).netloc}"


def _labels(names: list[tuple[str, str]], flags: list[str]) -> list[str]:
    """Each model's short name, or its long one where short names collide; ValueError naming the
    flags of models whose long names collide too."""
    shorts = [short for short, _ in names]
    labels = [short if shorts.count(short) == 1 else long for short, long in names]
    for label in dict.fromkeys(labels):
        same = [flag for flag, other in zip(flags, labels) if other == label]
        if len(same) > 1:
            raise ValueError(f"{' and '.join(same)} are one model or share the name {label!r}: give each model "
                             "once (a copy of a file under another name evaluates under that name)")
    return labels


def _loader(args: argparse.Namespace, path: str, chat: bool | None = None, decoder=None):
    """open() of a local model: loaded with the sweep's --dtype / --kv-dtype / --activations / --threads when its
    turn comes (with `decoder`'s combiner or rerank: `SweepDecoder.build`), its references
    dropped on exit so the next one loads into freed memory."""

    @contextmanager
    def open_model():
        import gc

        from metagen.decoding import LocalGenerator
        from metagen.eval.fingerprint import model_identity

        model = common.load_model(argparse.Namespace(**{**vars(args), "model": None if path == EMBEDDED else path}))
        decoding = {}
        try:
            decoding = decoder.build(model) if decoder is not None else {}
            yield LocalGenerator(model, chat, **decoding), model_identity(model)
        finally:
            del model, decoding
            gc.collect()

    return open_model
