"""`SamplingParams`: one frozen, validated description of how to pick tokens.

Field names and defaults follow vLLM and the OpenAI API so that requests map one to one. Every
field at its default leaves the model's distribution untouched; `SamplerChain.from_params` turns
the non-default fields into a chain of adapters once, before decoding starts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from metagen.structured.spec import StructuredOutputs, from_response_format

if TYPE_CHECKING:
    import torch

MAX_LOGPROBS = 20
LOGIT_BIAS_LIMIT = 100.0
TRUNCATION_DEFAULTS = {
    "top_k": (0, -1),
    "top_p": (1.0,),
    "min_p": (0.0,),
    "typical_p": (1.0,),
    "epsilon_cutoff": (0.0,),
    "eta_cutoff": (0.0,),
}


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    return ("(" if low_open else "[") + f"{low:g}, {high:g}" + (")" if high_open else "]")


def _real(name: str, value: object, low: float, high: float, low_open: bool = False,
          high_open: bool = False) -> float:
    """`value` as a float inside the interval, or ValueError naming the field and value."""
    allowed = _interval(low, high, low_open, high_open)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}={value!r} is not a number: must be in {allowed}")
    number = float(value)
    too_low = number <= low if low_open else number < low
    too_high = number >= high if high_open else number > high
    if math.isnan(number) or too_low or too_high:
        raise ValueError(f"{name}={value!r} is out of range: must be in {allowed}")
    return number


def _integer(name: str, value: object, low: int, high: int | None = None, allowed: str = "") -> int:
    """`value` as an int in [low, high], or ValueError naming the field and value."""
    allowed = allowed or (f"an int in [{low}, {high}]" if high is not None else f"an int >= {low}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r} is not an int: must be {allowed}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name}={value!r} is out of range: must be {allowed}")
    return value


def _logit_bias(value: object) -> tuple[tuple[int, float], ...] | None:
    """Normalise a mapping (or pairs) token id -> bias into a sorted tuple of pairs."""
    if value is None:
        return None
    pairs = value.items() if isinstance(value, Mapping) else value
    if not isinstance(pairs, Iterable):
        raise ValueError(f"logit_bias={value!r} must be a mapping of token id to bias")
    normalised: dict[int, float] = {}
    for pair in pairs:
        token_id, bias = pair
        token_id = _integer("logit_bias token id", token_id, 0)
        if token_id in normalised:
            raise ValueError(f"logit_bias token id {token_id} appears twice")
        normalised[token_id] = _real(f"logit_bias[{token_id}]", bias, -LOGIT_BIAS_LIMIT, LOGIT_BIAS_LIMIT)
    return tuple(sorted(normalised.items()))


def _strings(value: object) -> tuple[str, ...]:
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, Iterable):
        raise ValueError(f"stop={value!r} must be a string or a sequence of strings")
    items = tuple(items)
    for item in items:
        if not isinstance(item, str) or not item:
            raise ValueError(f"stop={value!r} must contain only non-empty strings, got {item!r}")
    return items


def _structured(structured_outputs: object, response_format: object) -> StructuredOutputs | None:
    """The request's constraint from either spelling, compiled once to check it (ValueError names the field)."""
    spec = from_response_format(response_format)
    if structured_outputs is not None:
        if spec is not None:
            raise ValueError("structured_outputs is set together with response_format: give one, not both")
        if isinstance(structured_outputs, Mapping):
            allowed = {item.name for item in fields(StructuredOutputs)} - {"field"}
            unknown = sorted(set(structured_outputs) - allowed)
            if unknown:
                raise ValueError(f"structured_outputs has unknown fields {unknown}: allowed are {sorted(allowed)}")
            spec = StructuredOutputs(**structured_outputs)
        elif isinstance(structured_outputs, StructuredOutputs):
            spec = structured_outputs
        else:
            raise ValueError(f"structured_outputs={structured_outputs!r} must be a StructuredOutputs or a mapping "
                             "of its fields")
    if spec is not None:
        from metagen.structured.compile import check_compiles  # imports llguidance: only when asked for

        check_compiles(spec)
    return spec


MOMENTUM_DEFAULTS = {"momentum_resistance": 0.2, "momentum_candidates": 5}


def _check_momentum(checked: Mapping[str, object], temperature: object) -> None:
    """Momentum decoding's settings apply with momentum_ngram only, and only under greedy decoding."""
    depth = checked["momentum_ngram"]
    if depth == 0:
        for name, default in MOMENTUM_DEFAULTS.items():
            if checked[name] != default:
                raise ValueError(f"{name}={checked[name]!r} applies with momentum_ngram only: give momentum_ngram "
                                 f"(the loop depth counted, e.g. 5) or leave {name} at {default}")
    elif checked["temperature"] != 0:
        raise ValueError(f"momentum_ngram={depth!r} cannot be combined with temperature={temperature!r}: momentum "
                         "decoding is a greedy decoder (the argmax of p - momentum_resistance * depth over the "
                         "momentum_candidates most likely tokens); its scores are not logits to sample from, "
                         "so set temperature=0")


@dataclass(frozen=True)
class SamplingParams:
    """How to choose tokens; vLLM / OpenAI names and defaults. All fields are validated.

    Fields:
        temperature: >= 0; 0 means greedy decoding (`greedy` property).
        top_p: nucleus mass in (0, 1]; 1 disables.
        top_k: tokens kept, >= 1; 0 or -1 disables.
        min_p: in [0, 1], relative to the top probability; 0 disables.
        typical_p: locally typical mass in (0, 1]; 1 disables.
        epsilon_cutoff: absolute probability floor in [0, 1); 0 disables.
        eta_cutoff: eta sampling parameter in [0, 1); 0 disables.
        repetition_penalty: > 0 (CTRL rule, prompt + generated tokens); 1 disables.
        frequency_penalty: in [-2, 2], times the count of each generated token; 0 disables.
        presence_penalty: in [-2, 2], once per distinct generated token; 0 disables.
        no_repeat_ngram_size: ban repeats of n-grams of this size (prompt + generated); 0 disables.
        logit_bias: token id -> bias in [-100, 100]; stored as a sorted tuple of pairs.
        mirostat_tau: target surprise in bits for Mirostat; None disables. Excludes top_k,
            top_p, min_p, typical_p, epsilon_cutoff, eta_cutoff and temperature 0.
        mirostat_eta: Mirostat learning rate in (0, 1].
        mirostat_mode: which Mirostat runs with mirostat_tau, as llama.cpp numbers them: 2 (cut at
            surprise mu) or 1 (top-k from a Zipf fit of the top 100 probabilities); a value other
            than 2 without mirostat_tau is refused (it would do nothing).
        momentum_ngram: momentum decoding (Lan et al. 2022, `metagen.sampling.momentum`): the
            longest repeated n-gram the depth of a loop counts, D (the authors use 5); 0 disables.
            A greedy decoder: needs temperature 0.
        momentum_resistance: alpha, the confidence a candidate loses per unit of loop depth, > 0.
        momentum_candidates: k, how many of the most likely tokens momentum decoding ranks, >= 1.
            momentum_resistance and momentum_candidates other than their defaults without
            momentum_ngram are refused (they would do nothing).
        seed: seed of the request's torch.Generator (see `make_generator`); None = fresh entropy.
        max_tokens: most tokens to generate, >= 1.
        stop: strings that end generation (a single string is wrapped in a tuple).
        stop_token_ids: token ids that end generation, besides EOS.
        ignore_eos: keep generating after EOS.
        n: number of samples per prompt, >= 1.
        logprobs: how many top log-probabilities to report per token, in [0, 20]; None = none.
        structured_outputs: a constraint on the output's shape (`metagen.structured.StructuredOutputs`,
            or a mapping of its fields: json / regex / choice / grammar / json_object); None = free text.
            Compiled when the params are built: a spec that fails is a ValueError naming the field.
        response_format: OpenAI's spelling of the same ({"type": "json_object"} or {"type":
            "json_schema", "json_schema": {"name", "schema", "strict"}}); converted into
            `structured_outputs` on construction (this field then reads None).
        token_healing: back up a prompt that ends mid-token and make the first generated tokens
            reproduce the removed text (`metagen.structured.healing`); the completions' text
            excludes it. Honoured by the sampling loop and speculative decoding; refused by name
            elsewhere (chat prompts ending with the assistant header, tree search, tokenwise
            controlled decoding, remote servers).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    typical_p: float = 1.0
    epsilon_cutoff: float = 0.0
    eta_cutoff: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    no_repeat_ngram_size: int = 0
    logit_bias: Mapping[int, float] | tuple[tuple[int, float], ...] | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float = 0.1
    mirostat_mode: int = 2
    momentum_ngram: int = 0
    momentum_resistance: float = 0.2
    momentum_candidates: int = 5
    seed: int | None = None
    max_tokens: int = 256
    stop: str | Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    n: int = 1
    logprobs: int | None = None
    structured_outputs: StructuredOutputs | Mapping[str, object] | None = None
    response_format: Mapping[str, object] | None = None
    token_healing: bool = False

    def __post_init__(self) -> None:
        inf = math.inf
        checked = {
            "temperature": _real("temperature", self.temperature, 0.0, inf, high_open=True),
            "top_p": _real("top_p", self.top_p, 0.0, 1.0, low_open=True),
            "min_p": _real("min_p", self.min_p, 0.0, 1.0),
            "typical_p": _real("typical_p", self.typical_p, 0.0, 1.0, low_open=True),
            "epsilon_cutoff": _real("epsilon_cutoff", self.epsilon_cutoff, 0.0, 1.0, high_open=True),
            "eta_cutoff": _real("eta_cutoff", self.eta_cutoff, 0.0, 1.0, high_open=True),
            "repetition_penalty": _real("repetition_penalty", self.repetition_penalty, 0.0, inf,
                                        low_open=True, high_open=True),
            "frequency_penalty": _real("frequency_penalty", self.frequency_penalty, -2.0, 2.0),
            "presence_penalty": _real("presence_penalty", self.presence_penalty, -2.0, 2.0),
            "no_repeat_ngram_size": _integer("no_repeat_ngram_size", self.no_repeat_ngram_size, 0),
            "logit_bias": _logit_bias(self.logit_bias),
            "mirostat_eta": _real("mirostat_eta", self.mirostat_eta, 0.0, 1.0, low_open=True),
            "momentum_ngram": _integer("momentum_ngram", self.momentum_ngram, 0),
            "momentum_resistance": _real("momentum_resistance", self.momentum_resistance, 0.0, inf,
                                         low_open=True, high_open=True),
            "momentum_candidates": _integer("momentum_candidates", self.momentum_candidates, 1),
            "max_tokens": _integer("max_tokens", self.max_tokens, 1),
            "stop": _strings(self.stop),
            "n": _integer("n", self.n, 1),
        }
        top_k = _integer("top_k", self.top_k, -1, allowed="-1 or 0 (disabled) or an int >= 1")
        checked["top_k"] = top_k
        checked["mirostat_mode"] = _integer("mirostat_mode", self.mirostat_mode, 1, 2)
        if self.mirostat_tau is None and checked["mirostat_mode"] != 2:
            raise ValueError(f"mirostat_mode={self.mirostat_mode!r} applies with mirostat_tau only: give "
                             "mirostat_tau (the target surprise in bits) or leave mirostat_mode at 2")
        _check_momentum(checked, self.temperature)
        if self.mirostat_tau is not None:
            checked["mirostat_tau"] = _real("mirostat_tau", self.mirostat_tau, 0.0, inf,
                                            low_open=True, high_open=True)
        if self.seed is not None:
            checked["seed"] = _integer("seed", self.seed, 0, 2**64 - 1)
        if self.logprobs is not None:
            checked["logprobs"] = _integer("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        if isinstance(self.stop_token_ids, (str, bytes)) or not isinstance(self.stop_token_ids, Iterable):
            raise ValueError(f"stop_token_ids={self.stop_token_ids!r} must be a sequence of ints")
        checked["stop_token_ids"] = tuple(
            _integer("stop_token_ids entry", token_id, 0) for token_id in self.stop_token_ids
        )
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos={self.ignore_eos!r} must be a bool")
        if not isinstance(self.token_healing, bool):
            raise ValueError(f"token_healing={self.token_healing!r} must be a bool")
        checked["structured_outputs"] = _structured(self.structured_outputs, self.response_format)
        checked["response_format"] = None
        if checked["structured_outputs"] is not None and self.ignore_eos:
            raise ValueError("ignore_eos=True cannot be combined with structured_outputs: the constraint ends the "
                             "output where it accepts, and only EOS can follow")
        for name, value in checked.items():
            object.__setattr__(self, name, value)
        if self.mirostat_tau is not None:
            for name in self.active_truncations:
                raise ValueError(
                    f"mirostat_tau={self.mirostat_tau!r} cannot be combined with "
                    f"{name}={getattr(self, name)!r}: mirostat replaces the truncation samplers"
                )
            if self.temperature == 0:
                raise ValueError(
                    f"mirostat_tau={self.mirostat_tau!r} cannot be combined with "
                    f"temperature={self.temperature!r} (greedy decoding does not sample)"
                )

    @property
    def greedy(self) -> bool:
        """True when temperature is 0: take the argmax instead of sampling."""
        return self.temperature == 0.0

    @property
    def uses_mirostat(self) -> bool:
        return self.mirostat_tau is not None

    @property
    def active_truncations(self) -> tuple[str, ...]:
        """Names of the truncation fields set to a non-default value, in chain order."""
        return tuple(
            name for name, neutral in TRUNCATION_DEFAULTS.items() if getattr(self, name) not in neutral
        )

    @property
    def has_penalties(self) -> bool:
        """True if any repetition, frequency, presence or n-gram penalty is active."""
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0 or self.no_repeat_ngram_size > 0)

    @property
    def is_default_sampling(self) -> bool:
        """True when tokens are drawn from the model's distribution exactly as it is."""
        return (self.temperature == 1.0 and not self.active_truncations and not self.has_penalties
                and not self.logit_bias and self.mirostat_tau is None)

    @property
    def logit_bias_map(self) -> dict[int, float]:
        """`logit_bias` as a fresh dict (empty when unset)."""
        return dict(self.logit_bias or ())

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A torch.Generator seeded with `seed`, or from fresh OS entropy when seed is None."""
        import torch  # here: importing SamplingParams imports no torch

        generator = torch.Generator(device=device)
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        return generator

    def to_dict(self) -> dict[str, object]:
        """Field name -> value (logit_bias as a dict), e.g. for logging a request."""
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        values["logit_bias"] = self.logit_bias_map if self.logit_bias else None
        return values
