"""How a problem is put to a model (`request`): a question as it is, followed by the run's prompt
suffix; a code problem completion-style for base models, chat-style for instruct models.

  completion  the prompt source as it is; the model continues it with the function's body,
              stopped at HumanEval's stop strings (Chen et al. 2021: the next top-level `def`,
              `class`, `if __name__`, `print(` or comment), sent as `SamplingParams.stop`;
              the generator must send text as it is (no chat template);
  chat        a request in words followed by the source in a ```python fence (`CHAT_REQUEST`);
              the generator wraps it in the model's chat template, and the reply holds the
              whole function in a fenced block.

`build_program` (`scoring/code_problems`) reads a reply of either kind. "auto" picks chat
exactly when a text prompt reaches the model through a chat template (`chat_applies`): a
local model's tokenizer has one (or the generator forces `chat`), or a remote backend sends text
to /v1/chat/completions (`OpenAIGenerator.chat`: its default; with chat=False, or a tokenizer
without a template, text goes to /v1/completions and completion-style is used). The mode
actually used is part of the run's set-up (`code_setup`, read back by `stored_mode`), so resumed
results never mix the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from metagen.eval.tasks import Problem
from metagen.sampling import SamplingParams

MODES = ("auto", "chat", "completion")
STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
CHAT_REQUEST = ("Complete the following Python function. Keep its signature, and reply with the whole "
                "function in a ```python block.\n\n```python\n{code}```")


def chat_applies(generator) -> bool:
    """Whether a text prompt given to `generator.generate` reaches the model through a chat
    template: its `chat` setting when set (a remote backend's is always set), else whether its
    local model's tokenizer has a template (`encode_prompt`'s default)."""
    if generator.chat is not None:
        return bool(generator.chat)
    source = generator.source_model()
    return source is not None and source.tokenizer.chat_template is not None


def resolve_mode(mode: str, generator) -> str:
    """"chat" or "completion" for `mode` ("auto": chat exactly when `chat_applies`); ValueError
    for an unknown mode, or completion-style with a generator that would wrap the source in a
    chat template (the model would see a request it was not asked, and the reply would not
    continue the function)."""
    if mode not in MODES:
        raise ValueError(f"code prompt mode {mode!r} must be one of {MODES}")
    applies = chat_applies(generator)
    if mode == "auto":
        return "chat" if applies else "completion"
    if mode == "completion" and applies:
        raise ValueError(f"code prompt mode 'completion' needs a generator that sends text as it is, but "
                         f"{type(generator).__name__} (chat={generator.chat}) wraps it in a chat template: "
                         "create it with chat=False, or use mode 'chat' or 'auto'")
    return mode


def code_prompt(source: str, mode: str) -> str:
    """The text a strategy is given for a code problem's prompt `source` in `mode`."""
    if mode == "chat":
        return CHAT_REQUEST.format(code=source if source.endswith("\n") else source + "\n")
    if mode == "completion":
        return source
    raise ValueError(f"code prompt mode {mode!r} must be 'chat' or 'completion' (resolve 'auto' first)")


def code_params(params: SamplingParams, mode: str) -> SamplingParams:
    """`params` with HumanEval's stop strings added in completion mode (kept as they are in chat)."""
    if mode != "completion":
        return params
    stop = (params.stop,) if isinstance(params.stop, str) else tuple(params.stop)
    return replace(params, stop=stop + tuple(s for s in STOP if s not in stop))


def code_setup(mode: str, timeout: float, memory_mb: int) -> dict:
    """The run set-up's "code" entry: what stored code units depend on besides the problem."""
    entry = {"prompt": mode, "timeout": timeout, "memory_mb": memory_mb}
    if mode == "chat":
        entry["request"] = CHAT_REQUEST
    else:
        entry["stop"] = list(STOP)
    return entry


def stored_mode(units) -> str | None:
    """The code prompt mode stored in a model's set-up (`ModelUnits.setup`'s "code" entry,
    `code_setup`), or None when its run had no code problems."""
    return units.setup.get("code", {}).get("prompt")


def code_mode(problems: Sequence[Problem], config, generator) -> str | None:
    """The code prompt mode of this run ("chat" or "completion", `resolve_mode` of
    `config.code_prompt`), or None when no problem is a code problem."""
    return resolve_mode(config.code_prompt, generator) if any(p.is_code for p in problems) else None


def request(problem: Problem, config, mode: str | None) -> tuple[str, SamplingParams]:
    """The prompt a strategy is given for `problem` and the sampling params of its samples (from
    an `EvalConfig`): the question plus `config.prompt_suffix` and `config.params`, or for a code
    problem its prompt and params in `mode`."""
    if not problem.is_code:
        return problem.question + config.prompt_suffix, config.params
    return code_prompt(problem.question, mode) + config.prompt_suffix, code_params(config.params, mode)
