"""`metagen generate` / `metagen info` through `metagen.cli.main`, output read with capsys."""

from __future__ import annotations

import json

import pytest

from metagen.cli import main

QUESTION = "What is the capital of France?"


def test_bad_sampling_value_exits_2_naming_the_field(capsys):
    assert main(["generate", QUESTION, "--top-p", "1.5"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("metagen: error: top_p=1.5 is out of range")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--temperature", "-1"], "temperature=-1.0"),
        (["--max-tokens", "0"], "max_tokens=0"),
        (["--logit-bias", "5"], "TOKEN_ID=BIAS"),
        # Beam search takes --max-tokens and the stop options only; others are refused, not ignored.
        (["--beam-width", "2", "--temperature", "0.5"], "cannot be combined with --temperature"),
        (["--beam-width", "2", "--repetition-penalty", "1.2"], "cannot be combined with --repetition-penalty"),
        (["--beam-width", "2", "--stop-token-id", "5", "--seed", "1", "--logit-bias", "3=1"],
         "cannot be combined with --seed, --logit-bias"),
        (["--beam-width", "0"], "width=0 is out of range"),
    ],
)
def test_other_bad_values_exit_2_with_a_message(capsys, argv, named):
    assert main(["generate", QUESTION, *argv]) == 2
    assert named in capsys.readouterr().err


def test_unparsable_value_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", QUESTION, "--max-tokens", "many"])
    assert exit_info.value.code == 2
    assert "--max-tokens" in capsys.readouterr().err


@pytest.mark.slow
def test_generate_json_prints_one_object_matching_the_library(model, capsys):
    from metagen.decoding import generate
    from metagen.sampling import SamplingParams

    assert main(["generate", QUESTION, "--temperature", "0", "--max-tokens", "8", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    payload = json.loads(out)
    library = generate(model, QUESTION, SamplingParams(temperature=0, max_tokens=8))
    expected = library.completions[0]
    assert payload["text"] == expected.text
    assert payload["tokens"] == expected.token_ids
    assert payload["logprobs"] == pytest.approx(expected.logprobs, abs=1e-5)
    assert payload["finish_reason"] == expected.finish_reason
    assert payload["stop_reason"] == expected.stop_reason
    assert payload["top_logprobs"] is None
    timing = payload["timing"]
    assert timing["prompt_tokens"] == len(model.tokenizer.encode_chat([{"role": "user", "content": QUESTION}]))
    assert timing["generated_tokens"] == len(expected.token_ids)
    for key in ("load_seconds", "prefill_seconds", "decode_seconds", "tokens_per_second"):
        assert timing[key] >= 0
    # the local path prints the loop's Cost, as the --backend path prints the server's
    cost = payload["cost"]
    for key in ("model_calls", "prompt_tokens_computed", "prompt_tokens_reused", "generated_tokens", "target_steps"):
        assert cost[key] == getattr(library.cost, key)
    assert cost["flops"] == pytest.approx(library.cost.flops, rel=1e-9)


@pytest.mark.slow
def test_generate_streams_plain_text(capsys):
    assert main(["generate", "Once upon a time", "--no-chat", "--temperature", "0", "--max-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n") and out.count("\n") >= 1
    assert len(out.strip()) > 0


@pytest.mark.slow
def test_info_json_describes_the_embedded_model(capsys):
    assert main(["info", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["architecture"] == "llama"
    assert facts["layers"] == 30
    assert facts["context_length"] == 8192
    assert facts["vocab_size"] == 49152
    assert facts["chat_template"] is True
    assert facts["eos_token_ids"] == [2]


@pytest.mark.slow
def test_beam_width_two_matches_beam_search(model, capsys):
    from metagen.decoding import BeamSearchConfig, beam_search

    argv = ["generate", QUESTION, "--beam-width", "2", "--max-tokens", "6", "--length-penalty", "0", "--json"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    library = beam_search(model, QUESTION, BeamSearchConfig(width=2, max_tokens=6, length_penalty=0.0))
    best = library.completions[0]
    assert payload["tokens"] == best.token_ids
    assert payload["text"] == best.text
    assert payload["logprob"] == pytest.approx(best.cumulative_logprob, abs=1e-5)
    assert payload["finish_reason"] == (best.finish_reason or "length")
    assert payload["timing"]["model_calls"] == payload["cost"]["model_calls"] == library.cost.model_calls >= 1
    assert payload["cost"]["flops"] == pytest.approx(library.cost.flops, rel=1e-9)


@pytest.mark.slow
def test_a_prompt_of_bytes_that_are_not_utf8_is_a_one_line_error(capsys):
    # On Linux, sys.argv holds the byte 0xe9 of a Latin-1 "café" as the lone surrogate "\udce9".
    assert main(["generate", "caf\udce9", "--max-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("metagen: error: prompt is not valid Unicode text") and err.count("\n") == 1
