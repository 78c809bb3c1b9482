"""Every adapter: input never modified, shapes kept, float32 out, -inf for removed tokens."""

from __future__ import annotations

import pytest
import torch

from metagen.sampling import (
    contrastive,
    epsilon,
    eta,
    frequency_penalty,
    greedy,
    logit_bias,
    min_p,
    mirostat_truncate,
    no_repeat_ngram,
    presence_penalty,
    repetition_penalty,
    temperature,
    top_k,
    top_p,
    typical,
)


def history_like(logits: torch.Tensor) -> torch.Tensor:
    """A (..., 5) token history with padding, matching logits' batch dims."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, logits.shape[-1], (*logits.shape[:-1], 5), generator=generator)
    ids[..., 0] = -1
    return ids


ADAPTERS = {
    "temperature": lambda x: temperature(x, 0.7),
    "top_k": lambda x: top_k(x, 3),
    "top_p": lambda x: top_p(x, 0.6),
    "min_p": lambda x: min_p(x, 0.2),
    "typical": lambda x: typical(x, 0.5),
    "epsilon": lambda x: epsilon(x, 0.1),
    "eta": lambda x: eta(x, 0.1),
    "repetition_penalty": lambda x: repetition_penalty(x, history_like(x), 1.5),
    "frequency_penalty": lambda x: frequency_penalty(x, history_like(x), 0.5),
    "presence_penalty": lambda x: presence_penalty(x, history_like(x), 0.5),
    "no_repeat_ngram": lambda x: no_repeat_ngram(x, history_like(x), 2),
    "logit_bias": lambda x: logit_bias(x, {0: 2.0, 3: -5.0}),
    "contrastive": lambda x: contrastive(x, x.flip(-1), alpha=0.1),
    "mirostat_truncate": lambda x: mirostat_truncate(
        x.reshape(-1, x.shape[-1]), torch.full((x[..., 0].numel(),), 2.0)
    ).reshape(x.shape),
}


def random_logits(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2


@pytest.mark.parametrize("name", ADAPTERS)
@pytest.mark.parametrize("shape", [(10,), (4, 10), (2, 3, 10)])
def test_input_unchanged_and_shape_kept(name: str, shape: tuple[int, ...]) -> None:
    logits = random_logits(*shape)
    logits[..., 5] = float("-inf")
    before = logits.clone()
    out = ADAPTERS[name](logits)
    assert torch.equal(logits, before), f"{name} modified its input"
    assert out.shape == logits.shape
    assert out.dtype == torch.float32
    assert out.data_ptr() != logits.data_ptr()
    # Removed tokens are exactly -inf; nothing becomes NaN or +inf; a -inf logit stays -inf.
    assert not torch.isnan(out).any() and not (out == float("inf")).any()
    assert torch.isinf(out[..., 5]).all()
    assert torch.isfinite(out).any(dim=-1).all(), f"{name} removed every token of a row"


@pytest.mark.parametrize("name", ADAPTERS)
def test_half_precision_input_gives_float32(name: str) -> None:
    logits = random_logits(3, 10).to(torch.bfloat16)
    before = logits.clone()
    out = ADAPTERS[name](logits)
    assert out.dtype == torch.float32
    assert torch.equal(logits, before)


HISTORY_BASED = {"repetition_penalty", "frequency_penalty", "presence_penalty", "no_repeat_ngram"}


@pytest.mark.parametrize("name", [name for name in ADAPTERS if name not in HISTORY_BASED])
def test_rows_are_independent(name: str) -> None:
    """Applying an adapter to a batch equals applying it row by row (no cross-row leakage).

    History-based adapters get per-row histories; they are covered by their own batched tests.
    """
    logits = random_logits(4, 10)
    batched = ADAPTERS[name](logits)
    for row in range(4):
        assert torch.equal(batched[row], ADAPTERS[name](logits[row : row + 1])[0])


@pytest.mark.parametrize(
    "name", ["top_k", "top_p", "min_p", "typical", "epsilon", "eta", "mirostat_truncate"]
)
def test_keep_all_shortcut_does_not_alias(name: str) -> None:
    """Neutral settings return a fresh tensor, so writing to the output cannot touch the input."""
    neutral = {
        "top_k": lambda x: top_k(x, 100),
        "top_p": lambda x: top_p(x, 1.0),
        "min_p": lambda x: min_p(x, 0.0),
        "typical": lambda x: typical(x, 1.0),
        "epsilon": lambda x: epsilon(x, 0.0),
        "eta": lambda x: eta(x, 0.0),
        "mirostat_truncate": lambda x: mirostat_truncate(x, torch.full((x.shape[0],), 1e9)),
    }[name]
    logits = random_logits(2, 10)
    before = logits.clone()
    out = neutral(logits)
    assert torch.equal(out, before)
    out.add_(1.0)
    assert torch.equal(logits, before)


def test_stateful_adapters_leave_their_input_alone() -> None:
    from metagen.sampling import Mirostat, NoRepeatNgramState, PenaltyState, SamplerChain, SamplingParams

    logits = random_logits(2, 10)
    before = logits.clone()
    penalties = PenaltyState.from_prompt([1, 2, 3], batch_size=2, vocab_size=10)
    penalties.accept(torch.tensor([4, 5]))
    ngrams = NoRepeatNgramState.from_prompt(2, [1, 2, 1], batch_size=2)
    chain = SamplerChain.from_params(
        SamplingParams(repetition_penalty=1.2, presence_penalty=0.5, no_repeat_ngram_size=2,
                       temperature=0.8, top_p=0.9),
        batch_size=2, vocab_size=10, prompt_ids=[1, 2, 1],
    )
    outputs = [
        penalties.apply(logits, repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.5),
        ngrams.apply(logits),
        Mirostat.create(2, tau=2.0).process(logits),
        chain.process(logits),
    ]
    assert torch.equal(logits, before)
    for out in outputs:
        assert out.shape == (2, 10) and out.dtype == torch.float32
        assert out.data_ptr() != logits.data_ptr()


@pytest.mark.parametrize("name", ADAPTERS)
@pytest.mark.parametrize(("bad", "reason"), [(float("nan"), "NaN"), (float("inf"), r"(NaN|\+inf)")],
                         ids=["nan", "inf"])
def test_nan_and_inf_are_passed_on_never_removed(name: str, bad: float, reason: str) -> None:
    """Regression: truncations turned a NaN into a removed -inf, so the choice after them drew a
    token from garbage. Kept, the NaN / +inf reaches the choice, which names it."""
    logits = random_logits(2, 10)
    logits[1, 4] = bad
    out = ADAPTERS[name](logits)
    assert torch.isfinite(out[0]).any()  # the clean row is untouched by the bad one
    with pytest.raises(ValueError, match=rf"row \(1,\) token \d+ is {reason}"):
        greedy(out)
