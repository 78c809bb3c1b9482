"""The sequence-level `Generator` interface that meta-generation strategies talk to.

    generator.generate(prompt, params) -> GenerationResult   # params.n completions + their Cost

A strategy never touches a model or a cache: the local backend (`LocalGenerator`) prefills the
prompt once, forks the cache into n rows and decodes them as one batch;
`metagen.remote.OpenAIGenerator` implements the same method over OpenAI-compatible servers
(completions with token ids where known, logprobs, finish reasons, and a Cost built from the
server's usage counts).

The contract beyond `generate` is explicit, never guessed from attributes:
  capabilities   what the completions carry and what else the backend offers (names in
                 `capabilities.py`); the base declares none, so a minimal generator runs the
                 strategies that read only text, and `StrategySpec.check` refuses the others.
  local_model()  the `LocalModel` (model + chat setting) of a generator with LOCAL_CACHE, for
                 searches that decode their own steps; any other generator raises ValueError.
  continue_prefix(prefix, params)
                 completions continuing a raw prefix (text or token ids) with no chat template
                 applied, for step searches over a generator with STEP_CONTINUATION.
  source_model() the local model whose weights produce the outputs, or None (for fingerprints).
  max_context / count_tokens(prompt)
                 the context length and a prompt's length in tokens, or None when the backend
                 cannot tell (prompt-length checks are skipped then).
  Cost.flops     of `generate`'s result: None when the backend cannot know its FLOPs, never 0.
  concurrent     True when `generate` may be called from several threads at once (a remote
                 client); False (the default) for a local model, which the evaluation harness
                 then refuses to run concurrently rather than serializing silently.
  served_identity()
                 the served model behind a remote backend (name, engine, base URLs), or None;
                 evaluation fingerprints use it where there are no local weights.
  reset_prefix_cache()
                 forget prompts kept between calls (LocalGenerator keeps the last one, see
                 `prompt_cache.py`), so the next call's cost is a first call's.
  RequestFailedError
                 what `generate` raises when a remote request finally failed (`errors.py`): the
                 server's fault, not the prompt's; the evaluation harness runs the other
                 problems on and names the unfinished ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from metagen.decoding import capabilities as caps
from metagen.decoding.adadec import AdaDecConfig
from metagen.decoding.combine import LogitsCombiner
from metagen.decoding.prompt_cache import PromptCache
from metagen.decoding.prompts import Prompt, encode_prompt
from metagen.decoding.result import GenerationResult
from metagen.decoding.sample_loop import generate
from metagen.sampling import SamplingParams


@dataclass(frozen=True)
class LocalModel:
    """What a generator with LOCAL_CACHE hands to searches: its `LanguageModel` and its chat
    setting (wrap text prompts in the model's chat template; None: when the model has one)."""

    model: object
    chat: bool | None


class Generator(ABC):
    """prompt + SamplingParams -> `params.n` completions with a `Cost`.

    capabilities: what this generator provides (see `metagen.decoding.capabilities`).
    chat: its chat-template setting, part of its identity (None: the model's default, or a
        backend that applies no template of its own).
    tokenizer: the tokenizer it knows (a local model's, or one given to a remote backend), else
        None; step values that read token ids use it.
    described_as: how refusals name it (`capabilities.described`); None: its class name.
    decoder: the token-level decoder it runs over its model's next-token choice (a combiner, or
        AdaDec's rerank config), or None; part of what produced its outputs (evaluation
        fingerprints, `eval.fingerprint.generator_identity`).
    """

    capabilities: frozenset[str] = frozenset()
    chat: bool | None = None
    tokenizer = None
    described_as: str | None = None
    decoder = None
    concurrent: bool = False
    # Whether a call repeating the last call's prompt reuses its computation (LocalGenerator's
    # `PromptCache`): evaluation from stored pools then charges a strategy's later rounds no
    # prefill, as running it on this generator would.
    keeps_prompt: bool = False
    # How its Cost.flops are estimated when not by the one formula of the architecture
    # (`models.flops.transformer_flops_per_token`), shown beside them in reports; None: exact.
    flops_estimate: str | None = None

    @abstractmethod
    def generate(
        self, prompt: Prompt, params: SamplingParams, *, generator: torch.Generator | None = None
    ) -> GenerationResult:
        """Completions of `prompt`; `result.cost` counts what producing them spent."""

    def decode(self, token_ids: list[int]) -> str:
        """The text of token ids (used by judges reading top logprobs); backends that know
        their tokenizer override it."""
        raise NotImplementedError(f"{type(self).__name__} cannot decode token ids")

    def local_model(self) -> LocalModel:
        """The local model and chat setting behind a generator with LOCAL_CACHE; ValueError
        naming the missing capability for any other."""
        caps.require({caps.LOCAL_CACHE}, self, "local_model()")
        raise NotImplementedError(f"{type(self).__name__} declares {caps.LOCAL_CACHE} but does not override "
                                  "local_model()")

    def continue_prefix(self, prefix: str | list[int], params: SamplingParams, *,
                        generator: torch.Generator | None = None) -> GenerationResult:
        """Completions that continue `prefix` exactly as given (raw text or token ids; no chat
        template is applied, so a prefix may end mid-answer), stopping at `params.stop`; each
        tells which stop ended it (`stop_reason`, or the sampled tokens' text). Generators with
        STEP_CONTINUATION that serve step searches override it."""
        caps.require({caps.STEP_CONTINUATION}, self, "continue_prefix()")
        raise NotImplementedError(f"{type(self).__name__} declares {caps.STEP_CONTINUATION} but does not override "
                                  "continue_prefix()")

    def source_model(self):
        """The local `LanguageModel` whose weights produce the outputs (its identity goes into
        evaluation fingerprints), or None for a backend without one."""
        return None

    def served_identity(self) -> dict | None:
        """What identifies the model a remote backend serves ({"name", "engine", "base_urls"}),
        or None for a backend without one (a local model: see `source_model`)."""
        return None

    @property
    def max_context(self) -> int | None:
        """Tokens a prompt plus its completion may take, or None when the backend cannot tell."""
        return None

    def count_tokens(self, prompt: Prompt) -> int | None:
        """Tokens `prompt` takes once encoded as `generate` would, or None when unknown."""
        return None

    def reset_prefix_cache(self) -> None:
        """Forget the prompts kept between calls, so the next call pays for its prompt as a first
        call does (evaluation runs each unit from a cold cache, so that a unit's cost is its own).
        The base keeps nothing; `LocalGenerator` empties its `PromptCache`. A server's own prefix
        cache is the server's (its usage counts report what it reused)."""


class ModelGenerator(Generator):
    """A `Generator` whose outputs come from a local `LanguageModel` (`self.model`, set by the
    subclass with `self.chat`), however its calls are run: in the caller's thread
    (`LocalGenerator`) or as requests to the serving engine (`serve.EngineGenerator`). Its
    tokenizer, context and prompt lengths are the model's."""

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def decode(self, token_ids: list[int]) -> str:
        return self.model.tokenizer.decode(list(token_ids))

    def source_model(self):
        return self.model

    @property
    def max_context(self) -> int | None:
        return self.model.max_context

    def count_tokens(self, prompt: Prompt) -> int | None:
        return len(encode_prompt(self.model.tokenizer, prompt, self.chat))

    def prefix_ids(self, prefix: str | list[int]) -> list[int]:
        """What `continue_prefix` continues: token ids as given, text by its plain encoding (no chat template)."""
        if isinstance(prefix, str):
            return self.model.tokenizer.encode(prefix, add_special_tokens=True)
        return list(prefix)


class LocalGenerator(ModelGenerator):
    """A `Generator` over a local `LanguageModel` (one prefill, n forked rows, one batch).

    chat: wrap text prompts in the model's chat template (None: when the model has one).
    jump_forward: feed the token runs a constraint forces in one forward (`sample_loop`); the
        output law is the same either way.
    prompt_cache: keep the last prompt's keys and values, so a call with the same prompt (a
        strategy sampling one prompt in rounds) copies them instead of computing the prompt again
        (`PromptCache`; outputs unchanged, the cost counts the prompt as reused; memory: one
        prompt's keys and values). False: every call prefills.
    combiner: a `LogitsCombiner` (`ContrastiveConfig`: contrastive decoding; `DExpertsConfig`)
        or `SwitchingCombiner` (`EntropyAdaptiveConfig`) whose companion models run next to
        `model` on every call (`sample_loop.stream`). Its samples are not the
        model's alone, so the generator then withholds what reads the model by itself: its
        cache (LOCAL_CACHE), hidden states and prompt scoring (`provides`). The companions keep
        no prompt between calls, so neither does the model then (no `PromptCache`): every call
        costs what a first one does, as evaluation from stored pools charges it (`keeps_prompt`).
    rerank: an `AdaDecConfig`: AdaDec's entropy-triggered lookahead rerank on every call
        (`decoding.adadec`). Searches that decode their own steps on the cache would not apply
        it, so the generator then withholds LOCAL_CACHE.
    The combiner or rerank is the generator's `decoder`.
    It provides everything a local model gives, STRUCTURED_OUTPUT included (every decoding loop
    honours `params.structured_outputs`).
    """

    capabilities = caps.ALL

    def __init__(self, model, chat: bool | None = None, *, jump_forward: bool = True,
                 prompt_cache: bool = True, combiner: LogitsCombiner | None = None,
                 rerank: AdaDecConfig | None = None) -> None:
        self.model = model
        self.combiner, self.rerank = combiner, rerank
        self.decoder = combiner if combiner is not None else rerank
        if self.decoder is not None:  # instance attributes: the class's stay every local model's
            provided = self.provides(combiner, rerank)
            self.capabilities, self.described_as = provided.capabilities, provided.described_as
        self.chat = chat
        self.jump_forward = jump_forward
        self.prompt_cache = PromptCache() if prompt_cache and combiner is None else None

    @staticmethod
    def provides(combiner=None, rerank=None) -> caps.Provided:
        """What a LocalGenerator with `combiner` / `rerank` provides, and how refusals name it.
        Only their kind is read, so a config whose companion models are not loaded yet (None)
        will do: a command checks its strategies against this before loading any model."""
        if combiner is None and rerank is None:
            return caps.Provided(caps.ALL)
        withheld = {caps.LOCAL_CACHE, caps.HIDDEN_STATES, caps.PROMPT_SCORING} if combiner is not None else \
            {caps.LOCAL_CACHE}
        decoder = combiner if combiner is not None else rerank
        return caps.Provided(caps.ALL - withheld, f"LocalGenerator with {type(decoder).__name__} (a decoder over "
                                                  "the model withholds what reads the model alone)")

    def local_model(self) -> LocalModel:
        caps.require({caps.LOCAL_CACHE}, self, "local_model()")  # a subclass may withhold it
        return LocalModel(self.model, self.chat)

    def continue_prefix(self, prefix: str | list[int], params: SamplingParams, *,
                        generator: torch.Generator | None = None) -> GenerationResult:
        """`generate` on the prefix's token ids (text: its plain encoding, no chat template), so
        a subclass's own decoding (speculative decoding) continues prefixes too."""
        return self.generate(self.prefix_ids(prefix), params, generator=generator)

    @property
    def keeps_prompt(self) -> bool:
        return self.prompt_cache is not None

    def reset_prefix_cache(self) -> None:
        if self.prompt_cache is not None:
            self.prompt_cache.clear()

    def generate(
        self, prompt: Prompt, params: SamplingParams, *, generator: torch.Generator | None = None
    ) -> GenerationResult:
        return generate(self.model, prompt, params, chat=self.chat, generator=generator,
                        jump_forward=self.jump_forward, prompt_cache=self.prompt_cache, combiner=self.combiner,
                        rerank=self.rerank)
