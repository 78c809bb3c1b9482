"""Options a chosen path would not read are refused, values are parsed with messages naming the
flag, and every failure of `metagen` is one line on stderr, never a traceback."""

from __future__ import annotations

import json

import pytest

from metagen.cli import common, info, main
from metagen.cli.args import parse_logit_bias, unescape

QUESTION = "What is the capital of France?"


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("\\n", "\n"), ("a\\tb", "a\tb"), ("\\r\\n", "\r\n"), ("\\\\n", "\\n"), ("\\x41\\u00e9", "Aé"),
        ("\\U0001F600", "\U0001F600"), ("\\d+", "\\d+"), ("plain", "plain"), ("\n", "\n"), ("ends\\", "ends\\"),
    ],
)
def test_unescape_interprets_the_usual_escapes_and_keeps_the_rest(typed, meant):
    assert unescape(typed) == meant


def test_logit_bias_values_parse_and_duplicates_are_refused():
    assert parse_logit_bias(["5=1.5", "7=-2"]) == {5: 1.5, 7: -2.0}
    with pytest.raises(ValueError, match="token 5 twice"):
        parse_logit_bias(["5=1", "5=2"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--logit-bias", "abc=1"], "--logit-bias 'abc=1': token id 'abc' is not an integer"),
        (["--logit-bias", "5=abc"], "--logit-bias '5=abc': bias 'abc' is not a number"),
        (["--logit-bias", "="], "--logit-bias '=': token id '' is not an integer"),
        (["--logit-bias", "5=1", "--logit-bias", "5=2"], "--logit-bias gives token 5 twice"),
        (["--threads", "0"], "--threads 0 is out of range"),
        (["--threads", "-1"], "--threads -1 is out of range"),
        (["--strategy", "greedy", "--temperature", "0.9"], "'greedy' decodes greedily: --temperature"),
        (["--strategy", "greedy", "--top-p", "0.5", "--seed", "3"], "--top-p, --seed would have no effect"),
        (["--strategy", "self_consistency", "--logprobs", "5"], "--logprobs applies to plain generation"),
        (["--logprobs", "5"], "--logprobs shows in the --json output only"),
        (["--temperature", "0", "--top-k", "5", "--seed", "1"], "--temperature 0 decodes greedily: --top-k, --seed"),
        (["--system", "Be brief.", "--no-chat"], "--system needs the chat template"),
        (["--strategy", "self_consistency", "--system", "Be brief.", "--no-chat"], "--system needs the chat template"),
        (["--strategy", "self_consistency", "--value", "steps"], "no chosen strategy uses a value"),
        # flags derived from each strategy's config dataclass
        (["--strategy", "self_consistency", "--max-steps", "3"], "max_steps is not an option of strategy"),
        (["--strategy", "rebase", "--value", "steps", "--strategy-temperature", "0"],
         "temperature=0.0 is out of range: must be > 0"),
        (["--strategy", "mcts", "--value", "steps", "--expansions", "0"], "expansions=0 is out of range"),
        (["--max-steps", "3"], "--max-steps configure a strategy: they apply with --strategy only"),
    ],
)
def test_options_no_path_reads_and_bad_values_are_refused_before_loading(capsys, monkeypatch, argv, message):
    monkeypatch.setattr(common, "load_model", lambda args: pytest.fail("the model was loaded before the check"))
    assert main(["generate", QUESTION, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("metagen: error: ") and err.count("\n") == 1
    assert message in err


def test_greedy_strategy_accepts_what_greedy_decoding_reads(capsys, monkeypatch):
    """Penalties and logit bias act under greedy decoding too: they are not refused."""
    monkeypatch.setattr(common, "load_model", lambda args: (_ for _ in ()).throw(RuntimeError("loaded")))
    assert main(["generate", QUESTION, "--strategy", "greedy", "--repetition-penalty", "1.2",
                 "--logit-bias", "5=-3"]) == 1  # got past the option checks to the load
    assert "RuntimeError: loaded" in capsys.readouterr().err


def test_an_unexpected_error_is_one_line_with_its_type(capsys, monkeypatch):
    def broken(args):
        raise KeyError("config.json field")

    monkeypatch.setattr(info, "run", broken)
    assert main(["info"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("metagen: error: KeyError: 'config.json field'")
    monkeypatch.setenv("METAGEN_TRACEBACK", "1")
    with pytest.raises(KeyError):
        main(["info"])


def test_a_batch_that_cannot_fit_is_refused_before_allocation(capsys, monkeypatch):
    from metagen.decoding import memory

    def no_prefill(*args, **kwargs):
        pytest.fail("prefill ran for a batch that cannot fit")

    monkeypatch.setattr(memory, "available_memory", lambda: 2**30)  # 1 GiB
    monkeypatch.setattr(common, "load_model", lambda args: _TinyModel(no_prefill))
    assert main(["generate", QUESTION, "--n", "100000", "--max-tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert "n=100000 is too large for this machine" in err and "use n <= " in err


class _TinyModel:
    """Just enough of a model for the checks that run before the first forward."""

    vocab_size = 49152
    max_context = 2048
    eos_token_ids = frozenset({0})
    kv_bytes_per_token = 0

    def __init__(self, prefill):
        from metagen.models.kgram import SymbolTokenizer

        self.tokenizer = SymbolTokenizer(sorted(set(QUESTION)))
        self.prefill = prefill


@pytest.mark.slow
def test_memory_bound_counts_logits_and_cache(model):
    from metagen.decoding.memory import LOGIT_COPIES, check_batch_fits

    config = model.config
    assert model.kv_bytes_per_token == 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4
    per_row = LOGIT_COPIES * model.vocab_size * 4 + 100 * model.kv_bytes_per_token
    from metagen.decoding import memory

    original = memory.available_memory
    try:
        memory.available_memory = lambda: 10 * per_row
        check_batch_fits(model, 10, 100)  # exactly fits
        with pytest.raises(ValueError, match="n=11 is too large.*use n <= 10"):
            check_batch_fits(model, 11, 100)
    finally:
        memory.available_memory = original


@pytest.mark.slow
def test_stop_escape_stops_at_a_real_newline(model, capsys):
    prompt = "List three fruits, one per line, no other text."
    assert main(["generate", prompt, "--temperature", "0", "--max-tokens", "30", "--json"]) == 0
    full = json.loads(capsys.readouterr().out)["text"]
    assert "\n" in full  # the model writes several lines
    assert main(["generate", prompt, "--temperature", "0", "--max-tokens", "30", "--json", "--stop", "\\n"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["stop_reason"] == "\n" and payload["text"] == full.split("\n")[0]


@pytest.mark.slow
def test_out_of_vocabulary_stop_token_is_refused_like_a_logit_bias(model, capsys):
    assert main(["generate", QUESTION, "--stop-token-id", "999999"]) == 2
    assert "stop_token_ids entry 999999 is out of range for vocab size 49152" in capsys.readouterr().err
    assert main(["generate", QUESTION, "--logit-bias", "999999=1"]) == 2
    assert "999999 is out of range for vocab size 49152" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("content", [b"not a safetensors file", b""])
def test_a_file_that_is_not_an_exit_adapter_is_named(model, capsys, tmp_path, content):
    path = tmp_path / "adapter.safetensors"
    path.write_bytes(content)
    assert main(["generate", QUESTION, "--speculative", "early-exit", "--exit-layer", "4",
                 "--exit-adapter", str(path), "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path} is not a metagen exit adapter" in err


def test_a_search_with_speculative_decoding_is_refused_naming_the_capability(capsys, monkeypatch):
    """The capability check inside the registry reaches the command line: tokenwise CD needs
    the local cache, which a speculative generator does not hand out; nothing is decoded. (Tree
    searches run on it through step continuation.)"""
    from tests.decoding.toy_model import ToyModel

    class Untouchable(ToyModel):
        def prefill(self, *args, **kwargs):
            raise AssertionError("a refused search ran the model")

    monkeypatch.setattr(common, "load_model", lambda args: Untouchable())
    assert main(["generate", QUESTION, "--strategy", "tokenwise_cd", "--value", "steps", "--speculative", "ngram"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("metagen: error: ") and err.count("\n") == 1
    assert "strategy 'tokenwise_cd' needs local_cache, which SpeculativeGenerator does not provide" in err


def test_derived_strategy_flags_reach_the_strategy_run(capsys, monkeypatch):
    from metagen.strategies.registry import StrategySpec

    seen = {}

    def capture(self, generator, prompt, n, params, options, rng, overrides=None):
        seen.update(name=self.name, n=n, options=options, overrides=overrides)
        raise ValueError("captured")

    monkeypatch.setattr(common, "load_model", lambda args: object())
    monkeypatch.setattr(StrategySpec, "run", capture)
    assert main(["generate", QUESTION, "--strategy", "mcts", "--n", "6", "--value", "steps", "--expansions", "2",
                 "--max-step-tokens", "5", "--exploration", "0.5",
                 "--no-math"]) == 2
    assert "captured" in capsys.readouterr().err
    assert (seen["name"], seen["n"]) == ("mcts", 6)
    assert seen["overrides"] == {"expansions": 2, "max_step_tokens": 5, "exploration": 0.5}
    assert seen["options"].value == "steps" and seen["options"].math is False
