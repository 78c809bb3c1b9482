"""One small table per serving engine: which `SamplingParams` fields it honours, under which
request name, and how it returns token ids.

Every field is either sent under the engine's name for it, or refused with the reason when set
to a non-neutral value (no silent drop: vLLM, SGLang and llama.cpp's server ignore unknown
request fields without a word). Honoured fields are sent even at their neutral value, because
engines have their own defaults: llama-cpp-python's server samples with top_k=40, top_p=0.95,
min_p=0.05, repeat_penalty=1.1 and temperature 0.8 unless told otherwise, and vLLM applies the
model's generation_config.json.

Sources (request / response schemas): vLLM `entrypoints/openai/protocol.py` (CompletionRequest:
top_k, min_p, repetition_penalty, stop_token_ids, ignore_eos, return_tokens_as_token_ids, which
writes "token_id:<id>" in place of token texts in logprobs; choices carry `stop_reason`);
SGLang `srt/entrypoints/openai/protocol.py` (the same sampling extras; choices carry
`matched_stop`; no token ids in /v1/completions answers); llama-cpp-python
`server/types.py` + `server/app.py` (top_k, min_p, repeat_penalty, mirostat_*; `n`, `best_of`
and `min_tokens` dropped by the server; prompts must be text; no stop_token_ids / ignore_eos).

A final assistant message is continued by vLLM (`continue_final_message=True,
add_generation_prompt=False`) and SGLang (`continue_final_message`); llama-cpp-python's server
ignores both fields and renders the conversation with the generation prompt, closing the
message and opening a new assistant turn (measured: the same prompt_tokens with and without
them, tests/remote/test_llama_cpp_server.py); OpenAI has no such field.

A server whose /v1/models `owned_by` names none of these engines (Ollama, LM Studio, TGI, a
gateway) runs on GENERIC, the "openai" table: OpenAI's fields only, which every OpenAI-compatible
server takes. `detect_engine` warns once, naming what that shape cannot do (`limitations`, read
from the table); `engine=` (`--engine` on the command line) names the engine instead.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields

from metagen.remote.constraints import supported_kinds
from metagen.sampling import SamplingParams

OPENAI_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "logit_bias": "logit_bias",
    "stop": "stop",
    "max_tokens": "max_tokens",
    "seed": "seed",
}
EXTRA_FIELDS = {  # vLLM and SGLang accept these on both endpoints
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
}
# Fields handled by the generator itself, not mapped one to one (structured_outputs: by
# remote/constraints.py, per engine and endpoint; response_format is folded into it).
GENERATOR_FIELDS = {"n", "logprobs", "mirostat_tau", "mirostat_eta", "mirostat_mode", "structured_outputs",
                    "response_format"}
# Fields no server is sent: token healing backs up the prompt with the tokenizer, which the client
# may not have (refused by name for remote generators).
CLIENT_ONLY_FIELDS = {"token_healing"}


@dataclass(frozen=True)
class Engine:
    """What one engine's OpenAI-compatible server honours.

    fields: SamplingParams field -> request field the server honours.
    ids_request: extra request fields that make the server return the sampled token ids.
    mirostat: the server runs Mirostat 1.0 and 2.0 (`mirostat_mode` 1 or 2, `mirostat_tau`, `mirostat_eta`).
    continues_final_message: /v1/chat/completions continues a final assistant message when
        asked (`continue_final_message`), rather than closing it and starting a new turn.
    owned_by: `owned_by` values of /v1/models entries that identify the engine.
    streams_usage: a streamed answer ends with a usage chunk when asked
        (`stream_options.include_usage`); llama-cpp-python's server has no such option.
    names_stop: a choice names the stop string that ended it (vLLM `stop_reason`, SGLang
        `matched_stop`); elsewhere only returned logprobs tell it (`ServerProfile.tells_stops`).
    """

    name: str
    fields: dict[str, str]
    ids_request: dict[str, object] = field(default_factory=dict)
    mirostat: bool = False
    continues_final_message: bool = False
    owned_by: tuple[str, ...] = ()
    streams_usage: bool = True
    names_stop: bool = False
    top_k_disabled: int = -1
    neutral_only: dict[str, tuple[str, str]] = field(default_factory=dict)
    notes: str = ""

    def __repr__(self) -> str:
        return f"Engine({self.name!r})"

    def refusal(self, name: str, value: object) -> str:
        reason = self.neutral_only[name][1] if name in self.neutral_only else (
            "it has no request field for it" + (f"; {self.notes}" if self.notes else ""))
        return (f"{name}={value!r} is not supported by {self.name}'s OpenAI-compatible server "
                f"({reason}); leave {name} at its default or use a backend that has it")


ENGINES = {
    "vllm": Engine("vllm", {**OPENAI_FIELDS, **EXTRA_FIELDS}, {"return_tokens_as_token_ids": True},
                   continues_final_message=True, names_stop=True, owned_by=("vllm",)),
    "sglang": Engine("sglang", {**OPENAI_FIELDS, **EXTRA_FIELDS}, continues_final_message=True,
                     names_stop=True, owned_by=("sglang",)),
    "llama.cpp": Engine(
        "llama.cpp",
        {name: wire for name, wire in OPENAI_FIELDS.items() if not name.endswith("_penalty")}
        | {"top_k": "top_k", "min_p": "min_p"},
        mirostat=True, owned_by=("me", "llamacpp", "llama.cpp"), top_k_disabled=0, streams_usage=False,
        neutral_only={
            name: (wire, (f"llama.cpp applies {wire} over a window of the last 64 tokens, "
                          f"prompt included, which is not how metagen defines {name}"))
            for name, wire in [("repetition_penalty", "repeat_penalty"),
                               ("frequency_penalty", "frequency_penalty"),
                               ("presence_penalty", "presence_penalty")]
        },
        notes="llama-cpp-python's server drops n and has no stop_token_ids, ignore_eos or typical_p"),
    "openai": Engine("openai", dict(OPENAI_FIELDS), owned_by=("openai", "system", "openai-internal")),
    # `metagen serve` takes every SamplingParams field under its own name (a new field is sent with
    # no edit here), and mirostat in llama.cpp's form (mirostat_mode 1 or 2 with mirostat_tau / mirostat_eta).
    "metagen": Engine(
        "metagen",
        {name: name for name in (field.name for field in fields(SamplingParams))
         if name not in GENERATOR_FIELDS and name not in CLIENT_ONLY_FIELDS},
        {"return_tokens_as_token_ids": True}, mirostat=True, owned_by=("metagen",)),
}


GENERIC = "openai"  # the shape of a server no `owned_by` identifies: OpenAI's fields only


def engine_named(name: str) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"engine={name!r} is unknown: must be one of {sorted(ENGINES)} or 'auto' "
                         "(--engine NAME on the command line)")
    return ENGINES[name]


def limitations(engine: Engine) -> list[str]:
    """What `engine`'s server cannot do that another engine of the table can, read from the
    table: the SamplingParams fields it has no request field for, token ids, Mirostat, continuing
    a final assistant message, a streamed usage, constraint kinds. O(engines · fields)."""
    others = [other for other in ENGINES.values() if other is not engine]
    fields = [name for name in dict.fromkeys(name for other in others for name in other.fields)
              if name not in engine.fields]
    kinds = [kind for kind in dict.fromkeys(kind for other in others for kind in supported_kinds(other.name))
             if kind not in supported_kinds(engine.name)]
    lacks = [f"no {', '.join(fields)}"] if fields else []
    features = [(not engine.ids_request and any(other.ids_request for other in others), "no token ids returned"),
                (not engine.mirostat and any(other.mirostat for other in others), "no mirostat"),
                (not engine.continues_final_message and any(other.continues_final_message for other in others),
                 "no continuation of a final assistant message"),
                (not engine.streams_usage and any(other.streams_usage for other in others), "no usage when streaming"),
                (bool(kinds), f"no {', '.join(kinds)} constraints")]
    return lacks + [text for lacking, text in features if lacking]


def detect_engine(models: list[dict], url: str) -> Engine:
    """The engine whose `owned_by` marks the /v1/models entries; else GENERIC, with a warning
    naming what it cannot do and how to name the engine."""
    owners = {str(entry.get("owned_by", "")).lower() for entry in models}
    for engine in ENGINES.values():
        if owners & set(engine.owned_by):
            return engine
    generic = ENGINES[GENERIC]
    warnings.warn(f"metagen: {url} is no engine metagen recognises by its /v1/models (owned_by={sorted(owners)}): "
                  f"running it as a generic OpenAI-compatible server ({GENERIC!r} table: "
                  f"{'; '.join(limitations(generic))}); if it is one of {sorted(ENGINES)}, name it with "
                  "--engine NAME (engine= in Python)", stacklevel=2)
    return generic


def _wire_value(name: str, value: object, engine: Engine) -> object:
    if name == "logit_bias":
        return {str(token_id): bias for token_id, bias in (value or ())}
    if name in ("stop", "stop_token_ids"):
        return list(value)
    if name == "top_k" and value in (0, -1):
        return engine.top_k_disabled  # 0 and -1 both spell "disabled"; engines validate one
    return value


def sampling_fields(params: SamplingParams, engine: Engine) -> dict[str, object]:
    """Request fields for `params` (all but n and logprobs), or ValueError naming the first
    non-default field the engine cannot honour."""
    defaults = SamplingParams()
    body: dict[str, object] = {}
    for name, value in params.to_dict().items():
        if name in GENERATOR_FIELDS:
            continue
        wire = engine.fields.get(name)
        if wire is not None:
            if value is not None and value != () and value != {}:
                body[wire] = _wire_value(name, getattr(params, name), engine)
            continue
        if value != getattr(defaults, name) and not (name == "top_k" and value in (0, -1)):
            raise ValueError(engine.refusal(name, value))
        if name in engine.neutral_only:  # the engine's own default is not neutral: say so
            body[engine.neutral_only[name][0]] = getattr(defaults, name)
    if params.mirostat_tau is not None:
        if not engine.mirostat:
            raise ValueError(engine.refusal("mirostat_tau", params.mirostat_tau))
        body.update(mirostat_mode=params.mirostat_mode, mirostat_tau=params.mirostat_tau,
                    mirostat_eta=params.mirostat_eta)
    elif engine.mirostat:
        body["mirostat_mode"] = 0
    return body
