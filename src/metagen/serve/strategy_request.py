"""The meta-generation strategy a request asks for -> a validated `StrategyRequest`.

`metagen` ({"strategy": NAME, option: value, ...}) or the model name `NAME:<served model>` asks
for a strategy (`parse_strategy`, called by the endpoints' parse, `request_fields.parse_fields`):
its options are the ones the strategy's config declares (`options.option`), checked by those
declarations (`StrategySpec.parse`: kind, range or choices) and refused as `metagen.<option>`. `max_n` (`metagen serve --max-n`, default `DEFAULT_MAX_N`) bounds
metagen.n and every option that counts work (widths, expansions, iterations, depths:
`options.check_work`), here, before anything is built for the request. Request fields a
strategy cannot honour (stream, n, logprobs, top_logprobs, echo) are refused by name.

A request names no file or URL for the server to open (a client must not make the server read
its files): options declared `opens` (metagen.retriever, dsp's metagen.train) are refused by
name. The search strategies (search, self_ask_search, dsp) search the corpus the server was
started with (`metagen serve --retriever`, built once at start-up), or are refused without one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from metagen.serve.body import DEFAULT_MAX_N, APIError, param_of
from metagen.serve.requests import StrategyRequest

if TYPE_CHECKING:
    from metagen.sampling import SamplingParams

SERVED_VALUES = ("steps", "judge")  # a value-head file would be a path named by the request: refused


def parse_strategy(body: Mapping, named: str | None, params: SamplingParams,
                   max_n: int = DEFAULT_MAX_N, retriever: str | None = None) -> StrategyRequest:
    """The strategy of a request: `metagen` {"strategy": NAME, option: value, ...} and/or the model
    name NAME:model (the two must agree); every option is checked by its declaration
    (`StrategySpec.parse`; n and every option that counts work <= `max_n`), and request fields a
    strategy cannot honour are refused by name. An option that names a file or URL to open
    (`Option.opens`: a corpus, a training file) is refused from a request; a strategy that
    searches (its config has `retriever`) searches `retriever`, the server's --retriever, and
    is refused when the server has none."""
    from metagen.strategies.registry import get_strategy

    given = body.get("metagen", {})
    if not isinstance(given, Mapping):
        raise APIError("metagen must be an object such as {\"strategy\": \"self_consistency\", \"n\": 8}", "metagen")
    given = dict(given)
    name = given.pop("strategy", None)
    if name is None and named is None:
        raise APIError("metagen.strategy is required (or name it in the model: strategy:model)", "metagen.strategy")
    if name is not None and named is not None and name != named:
        raise APIError(f"metagen.strategy={name!r} and the model name's strategy {named!r} disagree: give one",
                       "metagen.strategy")
    name = name if name is not None else named
    where = "metagen.strategy" if named is None or "strategy" in body.get("metagen", {}) else "model"
    if not isinstance(name, str):
        raise APIError(f"metagen.strategy={name!r} must be a strategy name", "metagen.strategy")
    try:
        spec = get_strategy(name)
    except ValueError as error:
        raise APIError(str(error), where) from None
    fields = spec.fields()
    for option in given:
        if option in fields and fields[option].opens:
            raise APIError(f"metagen.{option} is not accepted: it names a file or a URL, and the server opens none "
                           "that a request names" + (f"; this server's strategies search its own --retriever"
                                                     if option == "retriever" else ""), f"metagen.{option}")
    if "retriever" in fields:
        if retriever is None:
            raise APIError(f"strategy {name!r} is not served here: it searches a corpus, and this server was started "
                           "without one; start it with metagen serve --retriever bm25:PATH | dense:PATH | URL", where)
        given["retriever"] = retriever
    try:
        n, options, overrides = spec.parse(given, "metagen.", max_n=max_n, limit_name=f"--max-n {max_n}")
    except ValueError as error:
        message = str(error)  # "metagen.<option>..." for an option given or defaulted; anything else is about metagen
        options = {f"metagen.{option}": f"metagen.{option}" for option in [*given, *spec.fields()]
                   if isinstance(option, str)}
        raise APIError(message, param_of(message, options) or "metagen") from None
    if options.value is not None and options.value not in SERVED_VALUES:
        raise APIError(f"metagen.value={options.value!r}: this server takes {' or '.join(SERVED_VALUES)} (a value-head "
                       "file would be a path named by the request, which the server does not open)", "metagen.value")
    if spec.uses_value and options.value is None:
        raise APIError(f"strategy {name!r} needs metagen.value: {' or '.join(SERVED_VALUES)}", "metagen.value")
    refusals = (("stream", body.get("stream"), "the chosen output is known only when the strategy has finished"),
                ("n", params.n != 1, "a strategy returns one chosen output; its budget is metagen.n"),
                ("logprobs", body.get("logprobs"), "the chosen output may be built from several requests"),
                ("top_logprobs", "top_logprobs" in body, "the chosen output may be built from several requests"),
                ("echo", body.get("echo"), "a strategy's prompts are its own"))
    for field, refused, why in refusals:
        if refused:
            raise APIError(f"{field} is not supported with a strategy ({name!r}): {why}", field)
    return StrategyRequest(spec, n, options, overrides)
