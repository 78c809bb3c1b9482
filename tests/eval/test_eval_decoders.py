"""`metagen eval` with a token-level decoder (--contrastive, --dexperts, --entropy-adaptive,
--adadec): refusals by name before any model loads, the decoder in each model's label and
identity (a greedy run's units are never reused for a contrastive one), a companion model
loaded once for the sweep and checked against each model's vocabulary, and the FLOPs column
counting the companion's forwards (the embedded model with its first 8 layers as the amateur)."""

from __future__ import annotations

import json

import pytest

import metagen.models
from metagen.cli import common, main
from metagen.decoding.cost import forward_flops
from tests.eval.test_eval_cli import BASE, TextToy, _error, loads  # noqa: F401 - the toy-model load fixture


class AmateurText(TextToy):
    """The toy chain at half its logits: a companion that changes what contrastive decoding picks."""

    def forward(self, cache, tokens, *, logits="last", hidden=False):
        out = super().forward(cache, tokens, logits=logits, hidden=hidden)
        if out.logits is not None:
            out.logits = out.logits / 2
        return out


class WiderText(TextToy):
    """A toy whose vocabulary has one more id: not a companion of the toy."""

    @property
    def vocab_size(self) -> int:
        return super().vocab_size + 1


@pytest.fixture
def companions(monkeypatch, tmp_path):
    """Companion models given as files load through `metagen.models.load`: an AmateurText (a
    WiderText for a file named wider.gguf); the list records each load's path."""
    seen = []

    def load(path=None, dtype=None, **kwargs):
        seen.append(path)
        model = (WiderText if str(path).endswith("wider.gguf") else AmateurText)(str(path), "int4")
        model.config.name = model.name = "amateur"
        return model

    monkeypatch.setattr(metagen.models, "load", load)
    return seen


def _file(path) -> str:
    path.write_bytes(b"GGUF" + bytes(range(64)))
    return str(path)


@pytest.mark.parametrize(("argv", "named"), [
    (["--strategy", "pg_td", "--contrastive", "early-exit:2"],
     "--contrastive cannot evaluate strategy 'pg_td': strategy 'pg_td' needs local_cache"),
    (["--strategy", "greedy,tokenwise_cd", "--adadec", "--adadec-threshold", "1"],
     "--adadec cannot evaluate strategy 'tokenwise_cd': strategy 'tokenwise_cd' needs local_cache"),
    (["--strategy", "greedy", "--dexperts", "early-exit:1,early-exit:2", "--backend", "http://localhost:1"],
     "--dexperts cannot be combined with --backend"),
    (["--strategy", "greedy", "--alpha", "0.2"], "--alpha only apply with --contrastive AMATEUR"),
    (["--strategy", "greedy", "--dexperts-alpha", "2"], "--dexperts-alpha only apply with --dexperts"),
    (["--strategy", "greedy", "--entropy-window", "3"], "--entropy-window only apply with --entropy-adaptive"),
    (["--strategy", "greedy", "--adadec-lookahead", "3"], "--adadec-lookahead only apply with --adadec"),
    (["--strategy", "greedy", "--entropy-adaptive", "early-exit:2"], "--entropy-adaptive needs --entropy-threshold"),
    (["--strategy", "greedy", "--contrastive", "absent.gguf"], "--contrastive absent.gguf: no such file"),
    (["--strategy", "greedy", "--contrastive", "early-exit:0"], "early-exit:L needs L"),
    (["--strategy", "greedy", "--contrastive", "early-exit:2", "--alpha", "2"], "alpha=2.0 is out of range"),
    (["--strategy", "greedy", "--adadec", "--adadec-threshold", "1", "--contrastive", "early-exit:2"],
     "--adadec cannot be combined with --contrastive"),
])
def test_decoder_options_are_refused_by_name_before_any_model_loads(capsys, loads, argv, named):
    assert main(["eval", "--task", "arithmetic", "--count", "2", *argv]) == 2
    assert named in _error(capsys)
    assert loads == []


def test_a_contrastive_run_files_its_own_units_beside_greedy_ones(tmp_path, capsys, loads, companions):
    """One --out: the model alone, then under --contrastive AMATEUR, then again under a changed
    α: each decoder's units are new work under its own label and set-up, and a rerun reuses
    them all."""
    model, amateur, out = _file(tmp_path / "a.gguf"), _file(tmp_path / "amateur.gguf"), str(tmp_path / "out")
    argv = [*BASE, "--model", model, "--out", out]
    runs = [argv, [*argv, "--contrastive", amateur], [*argv, "--contrastive", amateur, "--alpha", "0.5"]]
    rows = []
    for run in runs:
        assert main(run) == 0, capsys.readouterr().err
        rows.append(json.loads(capsys.readouterr().out)["results"])
    assert [{row["model"] for row in run} for run in rows] == [
        {"a"}, {"a + contrastive(amateur, α 0.1)"}, {"a + contrastive(amateur, α 0.5)"}]
    lines = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    setups = [line for line in lines if line["kind"] == "setup"]
    assert [setup["model"] for setup in setups] == ["a", "a + contrastive(amateur, α 0.1)",
                                                    "a + contrastive(amateur, α 0.5)"]
    assert "decoder" not in setups[0]["setup"]["generator"]  # greedy set-ups stay as stored before decoders
    decoder = setups[1]["setup"]["generator"]["decoder"]
    assert decoder["kind"] == "ContrastiveConfig" and decoder["alpha"] == 0.1
    assert decoder["amateur"]["name"] == "amateur"
    units = [line for line in lines if line["kind"] != "setup"]
    assert len({line["fingerprint"]["setup"] for line in units}) == 3 and len(units) % 3 == 0
    before = (tmp_path / "out" / "results.jsonl").read_bytes()
    assert main(runs[1]) == 0 and json.loads(capsys.readouterr().out)["results"] == rows[1]
    assert (tmp_path / "out" / "results.jsonl").read_bytes() == before  # reused, nothing generated
    assert len(companions) == 3  # one load per run under a decoder (two, and the rerun)


def test_a_companion_file_loads_once_and_is_checked_against_every_model(tmp_path, capsys, loads, companions):
    first, second = _file(tmp_path / "a.gguf"), _file(tmp_path / "b.gguf")
    expert, anti = _file(tmp_path / "expert.gguf"), _file(tmp_path / "anti.gguf")
    argv = [*BASE, "--model", first, "--model", second, "--dexperts", f"{expert},{anti}", "--dexperts-alpha", "2"]
    assert main(argv) == 0, capsys.readouterr().err
    assert {row["model"] for row in json.loads(capsys.readouterr().out)["results"]} == {
        "a + dexperts(expert, anti, α 2)", "b + dexperts(expert, anti, α 2)"}
    assert [path for path, _ in loads] == [first, second] and companions == [expert, anti]  # once each
    wider = _file(tmp_path / "wider.gguf")
    assert main([*BASE, "--model", first, "--entropy-adaptive", wider, "--entropy-threshold", "1"]) == 2
    assert f"--entropy-adaptive {wider}: companion model 'amateur' has vocab_size=6, model 'toy' has 5" in \
        _error(capsys)


def test_main_as_the_expert_is_each_swept_model_itself_and_never_loaded(tmp_path, capsys, loads, companions):
    first, second = _file(tmp_path / "a.gguf"), _file(tmp_path / "b.gguf")
    anti = _file(tmp_path / "anti.gguf")
    argv = [*BASE, "--model", first, "--model", second, "--dexperts", f"main,{anti}", "--dexperts-alpha", "2"]
    assert main(argv) == 0, capsys.readouterr().err
    assert {row["model"] for row in json.loads(capsys.readouterr().out)["results"]} == {
        "a + dexperts(main, anti, α 2)", "b + dexperts(main, anti, α 2)"}
    assert companions == [anti]  # 'main' is not a file: only the anti-expert loads


def test_early_exit_needs_a_model_with_that_form_and_says_so_at_its_turn(tmp_path, capsys, loads):
    assert main([*BASE, "--model", _file(tmp_path / "a.gguf"), "--contrastive", "early-exit:2"]) == 2
    assert "--contrastive early-exit:2: the model (TextToy) has no early-exit form" in _error(capsys)


# ----------------------------------------------------------------------------- the embedded model

ARITHMETIC = ["eval", "--task", "arithmetic", "--limit", "2", "--strategy", "greedy", "--n", "1",
              "--max-tokens", "16"]


def _live_costs(out) -> list[dict]:
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return [line["cost"] for line in lines if line["kind"] == "live"]


@pytest.mark.slow
def test_the_flops_column_counts_the_amateur_forwards(tmp_path, capsys, monkeypatch, model):
    """Greedy with and without the first 8 layers as the amateur: every live unit's FLOPs are the
    expert's forwards over its P + G − 1 fed tokens, plus (contrastive) the amateur's over the
    same tokens (each model computes the prompt: P is prompt_tokens_computed / 2 then); the
    table's TFLOPs are their mean."""
    monkeypatch.setattr(common, "load_model", lambda args: model)
    amateur = model.truncated(8)
    plain, contrastive = tmp_path / "plain", tmp_path / "contrastive"
    assert main([*ARITHMETIC, "--out", str(plain)]) == 0
    capsys.readouterr()
    assert main([*ARITHMETIC, "--out", str(contrastive), "--contrastive", "early-exit:8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    per_token = []
    for out, models in ((plain, [model]), (contrastive, [model, amateur])):
        per_token.append([])
        for cost in _live_costs(out):
            assert cost["generated_tokens"] > 1  # decode steps ran, not the prefill alone
            fed = cost["prompt_tokens_computed"] // len(models) + cost["generated_tokens"] - 1
            assert cost["flops"] == pytest.approx(sum(forward_flops(m, 0, fed) for m in models), rel=1e-9)
            assert cost["model_calls"] == len(models) * cost["generated_tokens"]
            per_token[-1].append(cost["flops"] / fed)
    assert min(per_token[1]) > max(per_token[0]) * 1.2  # 8 of 30 layers and the LM head again
    [row] = report["results"]
    assert row["model"].endswith(" + contrastive(early-exit:8, α 0.1)")
    assert row["cost"]["flops"] == pytest.approx(sum(cost["flops"] for cost in _live_costs(contrastive)) / 2)


@pytest.mark.slow
def test_adadec_under_eval_counts_its_lookahead_forwards(tmp_path, capsys, monkeypatch, model):
    """τ = 0 pauses at every step: each unit runs more forwards than its tokens, and more FLOPs
    than the model's own forwards over them."""
    monkeypatch.setattr(common, "load_model", lambda args: model)
    out = tmp_path / "adadec"
    argv = [*ARITHMETIC, "--out", str(out), "--json", "--adadec", "--adadec-threshold", "0",
            "--adadec-candidates", "2", "--adadec-lookahead", "1"]
    assert main(argv) == 0
    [row] = json.loads(capsys.readouterr().out)["results"]
    assert row["model"].endswith(" + adadec(τ 0 bits, B 2, L 1)")
    for cost in _live_costs(out):
        fed = cost["prompt_tokens_computed"] + cost["generated_tokens"] - 1
        assert cost["model_calls"] > cost["generated_tokens"]
        assert cost["flops"] > forward_flops(model, 0, fed) * 1.01
