"""The per-row bookkeeping every loop shares (decoding/rows.py), token by token on the toy
tokenizer: stops, limits, records, processor verdicts, forks, and O(1) detokenization."""

from __future__ import annotations

import math

import pytest
import torch

from metagen.decoding.records import TokenRecord, token_records
from metagen.decoding.rows import Row
from metagen.decoding.stop_rules import StopRules
from metagen.sampling import NO_OPINION
from metagen.sampling import SamplingParams

from .toy_model import BOS, EOS, A, B, C, ToyModel, ToyTokenizer

RECORD = TokenRecord(-1.0, -0.5, 0.25, None)


def row_for(max_context: int = 64, prompt=(BOS,), **fields) -> Row:
    model = ToyModel(max_context=max_context)
    rules = StopRules.from_params(SamplingParams(**fields), model, len(prompt))
    return Row(model.tokenizer, list(prompt), rules, want_top=bool(fields.get("logprobs")))


def push_all(row: Row, tokens, verdict=NO_OPINION) -> list[str]:
    return [row.push(token, RECORD, verdict) for token in tokens]


def test_a_stop_string_across_a_token_boundary_is_held_back_then_cut():
    row = row_for(stop=["bc"])
    assert push_all(row, [A, B]) == ["a", ""]  # "b" could start "bc": held back
    assert row.full_text == "ab" and not row.finished
    assert row.push(C, RECORD) == ""
    c = row.completion
    assert (c.text, c.finish_reason, c.stop_reason, c.token_ids) == ("a", "stop", "bc", [A, B, C])


def test_held_text_is_released_when_the_stop_string_does_not_complete():
    row = row_for(stop=["bc"])
    assert push_all(row, [B, A]) == ["", "ba"]
    assert row.completion.text == "ba"


def test_a_stop_token_ends_the_row_without_text():
    row = row_for(stop_token_ids=[B])
    assert push_all(row, [A, B]) == ["a", ""]
    c = row.completion
    assert (c.text, c.finish_reason, c.stop_reason) == ("a", "stop", B)
    with pytest.raises(RuntimeError, match="already finished"):
        row.push(A, RECORD)


def test_eos_ends_the_row_unless_ignored():
    row = row_for()
    row.push(EOS, RECORD)
    assert (row.completion.finish_reason, row.completion.stop_reason) == ("stop", EOS)
    ignoring = row_for(ignore_eos=True, max_tokens=3)
    assert push_all(ignoring, [EOS, A, EOS]) == ["", "a", ""]  # special: no text
    c = ignoring.completion
    assert (c.text, c.finish_reason, c.stop_reason, c.token_ids) == ("a", "length", None, [EOS, A, EOS])


def test_max_tokens_ends_with_length_and_flushes_held_text():
    row = row_for(max_tokens=2, stop=["bz"])
    assert push_all(row, [A, B]) == ["a", "b"]
    assert (row.completion.finish_reason, row.completion.stop_reason) == ("length", None)


def test_the_context_bounds_max_tokens():
    assert StopRules.from_params(SamplingParams(max_tokens=10), ToyModel(max_context=5), 3).max_new_tokens == 2
    assert StopRules.from_params(SamplingParams(max_tokens=1), ToyModel(max_context=5), 3).max_new_tokens == 1
    row = row_for(max_context=5, prompt=(BOS, A, A), max_tokens=10)
    push_all(row, [C, C])
    assert row.completion.finish_reason == "length"
    with pytest.raises(ValueError, match="prompt has 5 tokens, the model's context is 5"):
        StopRules.from_params(SamplingParams(), ToyModel(max_context=5), 5)
    with pytest.raises(ValueError, match="stop_token_ids entry 9 is out of range for vocab size 5"):
        StopRules.from_params(SamplingParams(stop_token_ids=[9]), ToyModel(), 1)


def test_records_are_the_models_log_softmax_and_the_processed_one():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0]])
    processed = torch.tensor([[float("-inf"), 0.0, 0.0, float("-inf")], [0.0, 0.0, 0.0, 0.0]])
    records = token_records(logits, torch.tensor([2, 0]), processed, num_top=2)
    z = math.log(sum(math.exp(v) for v in (0.0, 1.0, 2.0, 3.0)))
    assert records[0].logprob == pytest.approx(2.0 - z)
    assert records[0].sampled == pytest.approx(math.log(0.5))
    assert records[1].logprob == pytest.approx(math.log(0.25)) and records[1].sampled == pytest.approx(math.log(0.25))
    # KL(uniform || p) = -log V - mean log p: 0 for the uniform row.
    assert records[1].certainty == pytest.approx(0.0, abs=1e-6)
    assert records[0].certainty == pytest.approx(-math.log(4) - sum(v - z for v in (0.0, 1.0, 2.0, 3.0)) / 4)
    assert list(records[0].top) == [3, 2] and list(records[0].top.values()) == pytest.approx([3 - z, 2 - z])
    greedy = token_records(logits, torch.tensor([3, 1]))
    assert [r.sampled for r in greedy] == [0.0, 0.0] and greedy[0].top is None


def test_a_row_keeps_what_each_push_recorded():
    row = row_for(logprobs=2)
    row.push(A, TokenRecord(-1.5, -1.0, 0.3, {A: -1.5, B: -2.0}))
    row.push(B, TokenRecord(-0.5, -0.25, 0.1, {B: -0.5, A: -3.0}))
    c = row.completion
    assert c.logprobs == [-1.5, -0.5] and c.sampling_logprobs == [-1.0, -0.25] and c.certainties == [0.3, 0.1]
    assert c.top_logprobs == [{A: -1.5, B: -2.0}, {B: -0.5, A: -3.0}] and c.cumulative_logprob == -2.0
    assert row_for().completion.top_logprobs is None


def test_processor_verdicts_end_rows_and_mark_them_complete_or_not():
    must = row_for()
    must.push(A, RECORD, (True, True))  # a processor: nothing can follow
    c = must.completion
    assert (c.finish_reason, c.stop_reason, c.complete, c.text) == ("stop", None, True, "a")
    cut = row_for(max_tokens=2)
    push_all(cut, [A, B], (False, False))  # max_tokens where the processor does not accept
    assert (cut.completion.finish_reason, cut.completion.complete) == ("length", False)
    string = row_for(stop=["b"])
    push_all(string, [A, B], (False, False))
    assert (string.completion.finish_reason, string.completion.complete) == ("stop", False)
    plain = row_for(max_tokens=1)
    plain.push(A, RECORD)
    assert plain.completion.complete is None  # no processor judged


def test_forks_continue_independently_from_the_same_held_text():
    row = row_for(stop=["bc"])
    push_all(row, [A, B])
    left, right = row.fork(), row.fork()
    assert left.push(C, RECORD) == "" and left.completion.finish_reason == "stop"
    assert right.push(A, RECORD) == "ba" and right.completion.text == "aba"
    assert row.completion.token_ids == [A, B] and row.completion.text == "a" and not row.finished


class CountingTokenizer(ToyTokenizer):
    """Counts how many token ids decoding has read in total."""

    def __init__(self) -> None:
        super().__init__()
        self.decoded_ids = 0

    def decode(self, ids, skip_special_tokens=False):
        self.decoded_ids += len(ids)
        return super().decode(ids, skip_special_tokens)


def test_text_is_decoded_incrementally_not_the_whole_row_per_token():
    tokenizer = CountingTokenizer()
    rules = StopRules.from_params(SamplingParams(max_tokens=2000, stop=["zz"]), ToyModel(max_context=4096), 1)
    row = Row(tokenizer, [BOS], rules)
    for i in range(1000):
        row.push([A, B, C][i % 3], RECORD)
    assert len(row.completion.text) == 1000
    assert tokenizer.decoded_ids < 20 * 1000  # O(1) per token; re-decoding the row would be ~500000


def test_skip_text_keeps_the_healed_prompt_text_out_of_the_output_and_its_stop_checks():
    """Token healing's removed text ("a" here) is reproduced by the first tokens but belongs to the
    prompt: it is not in the text, and a stop string equal to it matches only later text."""
    rules = StopRules(frozenset({EOS}), ("a",), 8)
    record = TokenRecord(0.0, 0.0, 0.0, None)
    row = Row(ToyTokenizer(), [BOS], rules, skip_text="a")
    assert row.push(A, record) == ""
    assert row.completion.finish_reason is None
    assert row.push(B, record) == "b"
    twin = row.fork()
    assert row.push(A, record) == "" and row.completion.finish_reason == "stop"  # the stop string, later
    assert row.completion.text == "b" and twin.completion.text == "b"
    other = Row(ToyTokenizer(), [BOS], StopRules(frozenset({EOS}), (), 8), skip_text="a")
    with pytest.raises(RuntimeError, match="does not reproduce"):
        other.push(B, record)
