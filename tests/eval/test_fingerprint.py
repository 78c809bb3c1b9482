"""Fingerprints: a model's identity follows its weights' content; a value-head file counts."""

import os
import shutil

from metagen.eval import EvalConfig
from metagen.eval.fingerprint import differences, model_identity, weights_digest
from metagen.eval.config import run_setup
from metagen.strategies.registry import StrategyOptions
from tests.eval.dice import DiceGenerator


def _rewrite(path, content: bytes) -> None:
    """New content with a new mtime (the digest memo keys on path, size, mtime and inode)."""
    stat = path.stat()
    path.write_bytes(content)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


def test_weights_digest_follows_the_content(tmp_path):
    weights = bytes(range(256)) * 4096  # 1 MiB
    model = tmp_path / "model.gguf"
    model.write_bytes(weights)
    first = weights_digest(model)
    copy = tmp_path / "copy.gguf"
    shutil.copy(model, copy)
    os.utime(copy, ns=(0, 10**9))
    assert weights_digest(copy) == first  # moved, copied or touched: the same model
    changed = bytearray(weights)
    changed[len(weights) // 2 + 1] ^= 1  # one bit in the middle
    _rewrite(model, bytes(changed))
    assert weights_digest(model) != first
    assert weights_digest(tmp_path / "absent.gguf") is None and weights_digest("") is None


def test_an_hf_directory_is_identified_by_its_weights_and_json(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 64)
    (tmp_path / "README.md").write_text("a model")
    first = weights_digest(tmp_path)
    _rewrite(tmp_path / "README.md", b"another text")
    assert weights_digest(tmp_path) == first
    _rewrite(tmp_path / "model.safetensors", b"\1" * 64)
    assert weights_digest(tmp_path) != first


def test_model_identity_reads_the_loaded_model(tmp_path):
    class Loaded:
        name = "m"
        dtype = "int8"
        source = str(tmp_path / "m.gguf")

    (tmp_path / "m.gguf").write_bytes(b"weights")
    assert model_identity(Loaded()) == {"name": "m", "class": "Loaded", "dtype": "int8",
                                        "weights": weights_digest(tmp_path / "m.gguf")}
    Loaded.source = "org/hub-model"  # not a local file: its name stands in
    assert model_identity(Loaded())["weights"] == "source:org/hub-model"


def test_a_value_head_file_counts_by_content(tmp_path):
    head = tmp_path / "head.safetensors"
    head.write_bytes(b"\0" * 32)
    config = EvalConfig(("rebase",), ns=(2,), options=StrategyOptions(value=str(head)))
    before = run_setup(config, DiceGenerator())
    _rewrite(head, b"\1" * 32)
    after = run_setup(config, DiceGenerator())
    old, new = differences(before, after)
    assert old.startswith("value_weights=") and new.startswith("value_weights=") and old != new
    steps = EvalConfig(("rebase",), ns=(2,), options=StrategyOptions(value="steps"))
    assert "value_weights" not in run_setup(steps, DiceGenerator())


def test_differences_name_every_differing_field():
    stored = {"model": {"dtype": "int4", "name": "m"}, "seed": 0}
    assert differences(stored, {"model": {"dtype": "fp32", "name": "m"}, "seed": 1}) == (
        "model.dtype='int4', seed=0", "model.dtype='fp32', seed=1")
    assert differences({}, {"model": {"dtype": "fp32"}}) == ("no model.dtype", "model.dtype='fp32'")


def test_a_damaged_digest_memo_is_recomputed(tmp_path, monkeypatch):
    import hashlib

    from metagen.eval.fingerprint import file_digest

    monkeypatch.setenv("METAGEN_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights" * 1000)
    expected = hashlib.sha256(model.read_bytes()).hexdigest()
    assert file_digest(model) == expected
    [memo] = (tmp_path / "cache" / "digests").iterdir()
    for damaged in ("", expected[:20], "z" * 64):  # empty (a reader racing a writer), cut, garbage
        memo.write_text(damaged)
        assert file_digest(model) == expected
    assert not list(memo.parent.glob("*.tmp"))


def test_token_healing_enters_the_setup_only_when_set():
    """A field added to SamplingParams after results were stored must not change the digest of a
    set-up that leaves it at its default (older results stay readable); set, it is part of it."""
    from dataclasses import replace

    from metagen.eval.fingerprint import digest
    from metagen.sampling import SamplingParams

    config = EvalConfig(("self_consistency",), ns=(2,), params=SamplingParams(temperature=0.8, max_tokens=256))
    setup = config.setup()
    assert "token_healing" not in setup["params"]
    older = {**setup, "params": {k: v for k, v in setup["params"].items() if k != "token_healing"}}
    assert digest(setup) == digest(older)
    healed = replace(config, params=replace(config.params, token_healing=True)).setup()
    assert healed["params"]["token_healing"] is True and digest(healed) != digest(setup)


def test_a_process_reward_model_checkpoint_counts_by_content(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 32)
    config = EvalConfig(("rebase",), ns=(2,), options=StrategyOptions(value=f"prm:{tmp_path}"))
    before = run_setup(config, DiceGenerator())
    _rewrite(weights, b"\1" * 32)
    old, new = differences(before, run_setup(config, DiceGenerator()))
    assert old.startswith("value_weights=") and new.startswith("value_weights=") and old != new
    served = EvalConfig(("rebase",), ns=(2,), options=StrategyOptions(value="reward:http://127.0.0.1:9"))
    assert "value_weights" not in run_setup(served, DiceGenerator())


def test_the_decoder_and_its_settings_are_part_of_the_set_up(tmp_path):
    """A results directory holding the model's own greedy units refuses the same model, under the
    same label, decoding contrastively (and a contrastive run's units another α), naming the
    decoder's field: a resumed run never takes one decoder's results for another's."""
    import pytest

    from metagen.decoding import LocalGenerator
    from metagen.decoding.adadec import AdaDecConfig
    from metagen.decoding.combine import ContrastiveConfig
    from metagen.eval import arithmetic_problems
    from metagen.eval.running import evaluate
    from metagen.sampling import SamplingParams
    from tests.eval.test_eval_cli import TextToy

    model, amateur = TextToy("m"), TextToy("amateur")
    amateur.config.name = "amateur"
    config = EvalConfig(("greedy",), ns=(1,), params=SamplingParams(temperature=0.8, max_tokens=3))
    problems = arithmetic_problems(2, 0, 9)

    def run(out, **decoder):
        return evaluate(LocalGenerator(model, **decoder), problems, config, out, label="m")

    run(tmp_path / "plain")
    with pytest.raises(ValueError, match=r"no generator\.decoder\.kind, .* generator\.decoder\.kind='ContrastiveConfig'"):
        run(tmp_path / "plain", combiner=ContrastiveConfig(amateur, alpha=0.1))
    run(tmp_path / "contrastive", combiner=ContrastiveConfig(amateur, alpha=0.1))
    with pytest.raises(ValueError, match=r"generator\.decoder\.alpha=0\.1, this run has generator\.decoder\.alpha=0\.2"):
        run(tmp_path / "contrastive", combiner=ContrastiveConfig(amateur, alpha=0.2))
    run(tmp_path / "contrastive", combiner=ContrastiveConfig(amateur, alpha=0.1))  # the same decoder resumes
    setup = run_setup(config, LocalGenerator(model, combiner=ContrastiveConfig(amateur)), None)
    assert setup["generator"]["decoder"]["amateur"] == model_identity(amateur)
    never = run_setup(config, LocalGenerator(model, rerank=AdaDecConfig(float("inf"))), None)
    assert never["generator"]["decoder"] == {"kind": "AdaDecConfig", "threshold": "inf", "candidates": 3,
                                             "lookahead": 5}
