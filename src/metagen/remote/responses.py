"""Reading /v1/completions and /v1/chat/completions answers into `Completion`s.

Token ids come from the server where it returns them: vLLM's `return_tokens_as_token_ids`
writes "token_id:<id>" for every token (sampled and top alternatives), and vLLM's newer
`return_token_ids` puts `token_ids` on each choice. Otherwise `token_ids` is None (unknown) and
the generator fills them from a tokenizer the user supplied, or leaves them unknown. Top
logprobs keyed by token id (`Completion.top_logprobs`) exist only when ids are known; the
server's text-keyed form is kept in `RemoteCompletion.top_logprob_texts`.

Which stop string ended a completion: the engine's `stop_reason` (vLLM) or `matched_stop`
(SGLang), else `stop_from_tokens`: llama.cpp's server (and OpenAI) cut the stop string from the
text but list the token holding it in logprobs, so the tokens' text beyond the returned text
starts with the stop that matched, and nothing beyond it means EOS.

One rule for whole answers and streams (`streaming.py`): an answer is complete when each of
the `expected` choices the request asked for (indices 0 … expected − 1, each once; an absent
index is 0) has text and ends with finish_reason "stop" or "length". Anything else — fewer
choices, an index the request never asked for, no finish reason, another one ("abort"), text
that is not a string, usage counts that are not non-negative integers — is a `ServerError`
naming what the server sent (the backend's fault: 502 in proxy mode), never a shorter result
and never a negative Cost.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from metagen.decoding.cost import Cost
from metagen.decoding.result import Completion
from metagen.remote.transport import ServerError

TOKEN_ID_PREFIX = "token_id:"
FINISH_REASONS = ("stop", "length")  # how a complete choice ends


@dataclass
class RemoteCompletion(Completion):
    """A `Completion` from a server. `token_ids` is None when the ids are unknown.

    tokens: the token texts the server reported with logprobs (None without logprobs).
    top_logprob_texts: per token, {token text: logprob} of the top alternatives as served.
    """

    tokens: list[str] | None = None
    top_logprob_texts: list[dict[str, float]] | None = None

    def past_text(self) -> str | None:
        """The sampled tokens' text beyond the returned text (the stop string the server cut,
        with the rest of its token), or None when the tokens' text is not known (no logprobs,
        or vLLM's "token_id:<id>" form)."""
        if self.tokens is None or any(token.startswith(TOKEN_ID_PREFIX) for token in self.tokens):
            return None
        return "".join(self.tokens)[len(self.text):]


def token_id(token: str) -> int | None:
    """The id in vLLM's "token_id:<id>" form, else None."""
    if isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX):
        digits = token[len(TOKEN_ID_PREFIX):]
        if digits.isdigit():
            return int(digits)
    return None


def stop_from_tokens(completion, stops) -> str | None:
    """The stop string in `stops` that the tokens' text beyond the returned text starts with;
    None when nothing is beyond it (EOS) or the tokens' text is unknown."""
    beyond = completion.past_text()
    return next((stop for stop in stops if beyond and beyond.startswith(stop)), None)


def _top(entries: dict[str, float], k: int) -> dict[str, float]:
    """The k highest of `entries` (servers may add the sampled token as a (k+1)-th entry)."""
    return dict(heapq.nlargest(k, entries.items(), key=lambda item: item[1]))


def _completion_logprobs(logprobs: dict) -> tuple[list[str], list[float], list[dict[str, float]] | None]:
    """tokens, token logprobs, top logprobs of a /v1/completions `logprobs` object."""
    tokens = list(logprobs.get("tokens") or [])
    values = [float(v) for v in logprobs.get("token_logprobs") or []]
    tops = logprobs.get("top_logprobs")
    tops = None if tops is None else [dict(entry or {}) for entry in tops]
    return tokens, values, tops


def _chat_logprobs(logprobs: dict) -> tuple[list[str], list[float], list[dict[str, float]] | None]:
    """tokens, token logprobs, top logprobs of a /v1/chat/completions `logprobs` object."""
    content = logprobs.get("content") or []
    tokens = [entry["token"] for entry in content]
    values = [float(entry["logprob"]) for entry in content]
    tops = [{top["token"]: float(top["logprob"]) for top in entry.get("top_logprobs") or []}
            for entry in content]
    return tokens, values, tops


def parse_choice(choice: dict, chat: bool, top_k: int | None) -> RemoteCompletion:
    """One choice as a `RemoteCompletion` (KeyError / TypeError on a malformed choice)."""
    text = choice["message"]["content"] if chat else choice["text"]
    if not isinstance(text, str):
        raise TypeError(f"choice text is {type(text).__name__}, not a string")
    completion = RemoteCompletion(text=text, token_ids=None)
    completion.finish_reason = choice.get("finish_reason")
    stop = choice.get("stop_reason", choice.get("matched_stop"))  # vLLM / SGLang
    completion.stop_reason = stop if isinstance(stop, (str, int)) and not isinstance(stop, bool) else None
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        completion.token_ids = list(ids)
    logprobs = choice.get("logprobs")
    if logprobs:
        tokens, values, tops = (_chat_logprobs if chat else _completion_logprobs)(logprobs)
        if not all(isinstance(token, str) for token in tokens):
            raise TypeError(f"logprobs tokens are not all strings: {str(tokens)[:100]}")
        completion.tokens, completion.logprobs = tokens, values
        sampled_ids = [token_id(token) for token in tokens]
        if completion.token_ids is None and tokens and None not in sampled_ids:
            completion.token_ids = sampled_ids
        if top_k and tops is not None:
            completion.top_logprob_texts = [_top(entry, top_k) for entry in tops]
            keyed = [{token_id(key): value for key, value in entry.items()} for entry in completion.top_logprob_texts]
            if all(None not in entry for entry in keyed):
                completion.top_logprobs = keyed
    return completion


def choice_index(choice: dict, expected: int, url: str) -> int:
    """The `index` of a choice (absent: 0), or ServerError unless it is one of the `expected`
    the request asked for (an int in 0 … expected − 1)."""
    index = choice.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < expected:
        raise ServerError(url, 200, f"the server sent choice index {index!r}, but the request asked for {expected} "
                                    f"choice{'s' if expected != 1 else ''} (0 to {expected - 1})")
    return index


def check_finish(finish_reason, index: int, url: str) -> None:
    """ServerError unless a choice's finish reason is one a complete choice ends with."""
    if finish_reason not in FINISH_REASONS:
        raise ServerError(url, 200, f"choice {index} finished with finish_reason={finish_reason!r} "
                                    "(expected 'stop' or 'length')")


def parse_choices(payload: dict, url: str, chat: bool, top_k: int | None, expected: int) -> list[RemoteCompletion]:
    """The `expected` completions of an answer, in `index` order, or ServerError saying what
    is wrong with it (see the module docstring)."""
    choices = payload.get("choices")
    if not isinstance(choices, list):
        raise ServerError(url, 200, f"answer has no 'choices' list: {str(payload)[:200]}")
    if len(choices) != expected:
        raise ServerError(url, 200, f"asked for {expected} choices, the server returned {len(choices)}")
    if not all(isinstance(choice, dict) for choice in choices):
        raise ServerError(url, 200, f"a choice is not a JSON object: {str(choices)[:200]}")
    indices = [choice_index(choice, expected, url) for choice in choices]
    for index in indices:
        if indices.count(index) > 1:
            raise ServerError(url, 200, f"the server sent choice index {index} twice (asked for {expected} choices)")
    try:
        ordered = [choice for _, choice in sorted(zip(indices, choices), key=lambda pair: pair[0])]
        completions = [parse_choice(choice, chat, top_k) for choice in ordered]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ServerError(url, 200, f"malformed choice ({type(error).__name__}: {error}): "
                                    f"{str(choices)[:200]}") from None
    for index, completion in enumerate(completions):
        check_finish(completion.finish_reason, index, url)
    return completions


def _token_count(value, name: str, url: str) -> int:
    """`value` as a count of tokens, or ServerError naming the usage field (the server's fault)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ServerError(url, 200, f"usage.{name}={value!r} from the server is not a token count "
                                    "(expected a non-negative integer)")
    return value


def usage_cost(answer: dict, url: str, parameter_count: float | None) -> Cost:
    """The Cost of one answered request, from its `usage`: prompt tokens computed vs served
    from the prefix cache (`prompt_tokens_details.cached_tokens`, absent or null: 0), generated
    tokens, and FLOPs = 2 · parameter_count · (computed + generated), None when the parameter
    count is unknown. ServerError naming the field for counts that are missing, not
    non-negative integers, or more cached tokens than prompt tokens."""
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        raise ServerError(url, 200, f"answer has no usage counts: {str(answer)[:200]}")
    for name in ("prompt_tokens", "completion_tokens"):
        if name not in usage:
            raise ServerError(url, 200, f"usage.{name} is missing from the server's answer: {str(usage)[:200]}")
    prompt = _token_count(usage["prompt_tokens"], "prompt_tokens", url)
    generated = _token_count(usage["completion_tokens"], "completion_tokens", url)
    details = usage.get("prompt_tokens_details")
    if details is not None and not isinstance(details, dict):
        raise ServerError(url, 200, f"usage.prompt_tokens_details={details!r} from the server is not an object")
    cached = (details or {}).get("cached_tokens")
    cached = 0 if cached is None else _token_count(cached, "prompt_tokens_details.cached_tokens", url)
    if cached > prompt:
        raise ServerError(url, 200, f"usage.prompt_tokens_details.cached_tokens={cached} from the server is more "
                                    f"than usage.prompt_tokens={prompt}")
    computed = prompt - cached
    flops = None if parameter_count is None else 2.0 * parameter_count * (computed + generated)
    return Cost(model_calls=1, prompt_tokens_computed=computed, prompt_tokens_reused=cached,
                generated_tokens=generated, flops=flops, target_steps=generated)
