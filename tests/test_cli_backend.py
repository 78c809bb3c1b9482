"""`metagen generate` and `metagen eval` on a remote OpenAI-compatible server (--backend): against
the scripted fake server, and (slow) against a real llama.cpp server over the embedded model."""

from __future__ import annotations

import json
import warnings

import pytest

pytest.importorskip("httpx")

from metagen.cli import main
from tests.remote.conftest import llama_server  # noqa: F401 - the session fixture, for the slow tests
from tests.remote.fake_server import FakeServer

EVAL = ["eval", "--task", "arithmetic", "--count", "4", "--strategy", "greedy,self_consistency", "--n", "1,2",
        "--max-tokens", "8"]


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _generation_paths(server: FakeServer) -> list[str]:
    """The endpoints of the requests that generated (the probe's one-token requests left out)."""
    return [path for path, body, _ in server.requests if body and body.get("max_tokens") != 1]


def _timeless(text: str) -> list[dict]:
    """The --json summary's points without their wall-clock seconds."""
    return [{**point, "cost": {k: v for k, v in point["cost"].items() if k != "wall_seconds"}}
            for point in json.loads(text)["results"]]


def test_generate_on_a_backend_prints_one_json_object(capsys):
    with FakeServer("vllm") as server:
        code, out, err = _run(capsys, "generate", "--backend", server.url, "What is 2+2?", "--temperature", "0",
                              "--json", "--max-tokens", "4")
        body = server.posts()[-1]
    assert code == 0, err
    payload = json.loads(out)
    assert payload["text"] == " eps zeta alpha beta" and payload["tokens"] == [100, 101, 102, 103]
    assert payload["timing"]["prompt_tokens"] == 5 and payload["cost"]["model_calls"] == 1
    assert body["messages"] == [{"role": "user", "content": "What is 2+2?"}]
    assert body["temperature"] == 0.0 and body["max_tokens"] == 4


@pytest.mark.parametrize(("flags", "endpoint"), [((), "/v1/chat/completions"), (("--chat",), "/v1/chat/completions"),
                                                 (("--no-chat",), "/v1/completions")])
def test_a_text_prompt_goes_to_the_chat_endpoint_unless_no_chat(capsys, flags, endpoint):
    """An instruct model behind a server gets its chat template by default (the server applies it
    on /v1/chat/completions); --no-chat sends the text as it is to /v1/completions."""
    with FakeServer("vllm") as server:
        code, _, err = _run(capsys, "generate", "--backend", server.url, "What is 2+2?", *flags, "--max-tokens", "4")
        path, body, _ = server.requests[-1]
    assert code == 0, err
    assert _generation_paths(server) == [endpoint] and path == endpoint
    if endpoint == "/v1/completions":
        assert body["prompt"] == "What is 2+2?" and "messages" not in body
    else:
        assert body["messages"] == [{"role": "user", "content": "What is 2+2?"}] and "prompt" not in body


@pytest.mark.parametrize(("flags", "endpoint"), [((), "/v1/chat/completions"), (("--no-chat",), "/v1/completions")])
def test_a_strategy_on_a_backend_sends_its_samples_as_chat_unless_no_chat(capsys, flags, endpoint):
    with FakeServer("vllm") as server:
        code, out, err = _run(capsys, "generate", "--backend", server.url, "Hi", "--strategy", "self_consistency",
                              "--n", "3", "--max-tokens", "4", "--json", *flags)
    assert code == 0, err
    assert len(json.loads(out)["candidates"]) == 3
    assert set(_generation_paths(server)) == {endpoint}


@pytest.mark.parametrize(("flags", "endpoint", "chat"), [((), "/v1/chat/completions", True),
                                                         (("--no-chat",), "/v1/completions", False)])
def test_eval_on_a_backend_sends_prompts_as_chat_unless_no_chat(capsys, tmp_path, flags, endpoint, chat):
    with FakeServer("vllm") as server:
        code, out, err = _run(capsys, *EVAL, "--backend", server.url, *flags, "--out", str(tmp_path), "--json")
    assert code == 0, err
    assert _generation_paths(server) and set(_generation_paths(server)) == {endpoint}
    assert {row["chat"] for row in json.loads(out)["results"]} == {chat}
    setup = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[0])["setup"]
    assert setup["generator"] == {"class": "OpenAIGenerator", "chat": chat}


def test_a_server_of_no_known_engine_runs_as_the_generic_openai_shape_with_one_warning(capsys):
    """Ollama, LM Studio, TGI or a gateway: /v1/models names no engine metagen knows, so it runs on
    OpenAI's fields only, with one warning naming what that shape cannot do and the flag to say."""
    from metagen.remote.engines import ENGINES, limitations

    with FakeServer("openai", owned_by="library") as server:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            code, out, err = _run(capsys, "generate", "--backend", server.url, "Hi", "--json", "--max-tokens", "4")
        assert code == 0, err
        said = [str(warning.message) for warning in caught if "/v1/models" in str(warning.message)]
        assert len(said) == 1
        assert said[0].startswith(f"metagen: {server.url} is no engine metagen recognises by its /v1/models "
                                  "(owned_by=['library'])")
        assert "no top_k, min_p, repetition_penalty" in said[0] and "no token ids returned" in said[0]
        assert all(text in said[0] for text in limitations(ENGINES["openai"])) and "--engine NAME" in said[0]
        assert json.loads(out)["tokens"] is None  # the generic shape returns no token ids
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code, _, err = _run(capsys, "generate", "--backend", server.url, "Hi", "--top-k", "5")
    assert code == 2 and "top_k=5 is not supported by openai's OpenAI-compatible server" in err


def test_engine_names_the_engine_of_a_server_its_models_do_not_identify(capsys):
    with FakeServer("vllm", owned_by="gateway") as server:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # named: no warning
            code, out, err = _run(capsys, "generate", "--backend", server.url, "Hi", "--engine", "vllm", "--top-k",
                                  "5", "--json", "--max-tokens", "4")
        body = server.requests[-1][1]
    assert code == 0, err
    assert body["top_k"] == 5 and body["return_tokens_as_token_ids"] is True  # vLLM's fields
    assert json.loads(out)["tokens"] == [100, 101, 102, 103]  # and its token ids


def test_eval_takes_one_engine_per_backend(capsys, tmp_path):
    with FakeServer("sglang", model="known") as known, FakeServer("vllm", model="hidden", owned_by="gateway") as hidden:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            code, _, err = _run(capsys, *EVAL, "--backend", known.url, "--backend", hidden.url, "--engine", "auto",
                                "--engine", "vllm", "--out", str(tmp_path))
    assert code == 0, err
    setups = {record["model"]: record["setup"]["model"]["engine"]
              for record in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines())
              if record["kind"] == "setup"}
    assert setups == {"known": "sglang", "hidden": "vllm"}


def test_generate_with_a_strategy_on_a_backend_without_token_ids(capsys):
    with FakeServer("sglang") as server:
        code, out, err = _run(capsys, "generate", "--backend", server.url, "Hi", "--strategy", "self_consistency",
                              "--n", "3", "--json", "--served-model", "fake-model")
    assert code == 0, err
    payload = json.loads(out)
    assert len(payload["candidates"]) == 3 and all(c["tokens"] is None for c in payload["candidates"])


def test_a_tokenizer_gives_token_ids_the_server_does_not_return(capsys):
    from metagen.models import embedded_model_path

    with FakeServer("sglang") as server:
        code, out, err = _run(capsys, "generate", "--backend", server.url, "Hi", "--no-chat", "--json",
                              "--tokenizer", str(embedded_model_path()))
    assert code == 0, err
    payload = json.loads(out)
    assert payload["tokens"] and all(isinstance(t, int) for t in payload["tokens"])


@pytest.mark.parametrize("argv, message", [
    (["--model", "x.gguf"], "--model configure the local model, which --backend replaces"),
    (["--threads", "1", "--dtype", "fp32"], "--dtype, --threads configure the local model"),
    (["--beam-width", "2"], "--beam-width configure the local model"),
    (["--speculative", "ngram"], "--speculative configure the local model"),
])
def test_local_model_options_are_refused_with_a_backend(capsys, argv, message):
    code, _, err = _run(capsys, "generate", "Hi", "--backend", "http://127.0.0.1:9/v1", *argv)
    assert code == 2 and message in err


@pytest.mark.parametrize("argv, message", [
    (["--served-model", "m"], "--served-model configure a remote server: add --backend URL"),
    (["--parameters", "7e9", "--tokenizer", "t"], "--parameters, --tokenizer configure a remote server"),
    (["--backend", "host:8000"], "must start with http:// or https://"),
    (["--backend", "http://a/v1,http://a/v1"], "names http://a/v1 more than once"),
    (["--engine", "vllm"], "--engine configure a remote server: add --backend URL"),
])
def test_remote_options_are_checked(capsys, argv, message):
    code, _, err = _run(capsys, "generate", "Hi", *argv)
    assert code == 2 and message in err


def test_engine_choices_are_the_engine_table(capsys):
    from metagen.remote.engines import ENGINES

    with pytest.raises(SystemExit) as exit:
        main(["generate", "Hi", "--backend", "http://127.0.0.1:9/v1", "--engine", "ollama"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "argument --engine: invalid choice: 'ollama'" in err
    assert all(repr(name) in err for name in ["auto", *ENGINES])


def test_eval_concurrency_needs_a_backend(capsys, tmp_path):
    code, _, err = _run(capsys, *EVAL, "--concurrency", "2", "--out", str(tmp_path))
    assert code == 2 and "--concurrency 2 needs --backend" in err
    code, _, err = _run(capsys, *EVAL, "--concurrency", "0", "--backend", "http://127.0.0.1:9/v1")
    assert code == 2 and "--concurrency 0 is out of range" in err


def test_several_urls_make_a_fleet_identified_by_every_url(capsys, tmp_path):
    from metagen.remote import FleetGenerator, connect

    with FakeServer("vllm") as first, FakeServer("vllm") as second:
        fleet = connect([first.url, second.url])
        try:
            assert isinstance(fleet, FleetGenerator) and fleet.concurrent
            assert [url.rstrip("/") for url in fleet.served_identity()["base_urls"]] == [
                first.url.rstrip("/"), second.url.rstrip("/")]
        finally:
            fleet.close()
        code, out, err = _run(capsys, *EVAL, "--backend", f"{first.url},{second.url}", "--concurrency", "2",
                              "--out", str(tmp_path), "--json")
        assert code == 0, err
        assert first.posts() and second.posts()  # both replicas served the evaluation


def test_eval_on_a_backend_runs_concurrently_and_resumes_without_regenerating(capsys, tmp_path):
    with FakeServer("vllm") as server:
        code, out, err = _run(capsys, *EVAL, "--backend", server.url, "--concurrency", "2", "--out", str(tmp_path),
                              "--json")
        assert code == 0, err
        first = (tmp_path / "results.jsonl").read_bytes()
        generated = len(server.posts())
        code, again, err = _run(capsys, *EVAL, "--backend", server.url, "--concurrency", "2", "--out",
                                str(tmp_path), "--json")
        assert code == 0, err
        probes = len(server.posts()) - generated
    assert (tmp_path / "results.jsonl").read_bytes() == first  # nothing regenerated or appended
    assert probes <= 3  # the rerun only probed the server
    setup = json.loads(first.splitlines()[0])["setup"]
    assert setup["model"] == {"name": "fake-model", "engine": "vllm", "base_urls": [server.url]}
    assert _timeless(again) == _timeless(out)


def test_eval_on_a_backend_without_flops_places_no_point_and_says_so(capsys, tmp_path):
    """A served model has no parameter count here: its FLOPs are unknown, so no configuration is
    put on the frontier or chosen for a budget (never as if it cost 0); all are listed unplaced."""
    with FakeServer("vllm") as server:
        code, out, err = _run(capsys, *EVAL, "--backend", server.url, "--out", str(tmp_path), "--json")
        assert code == 0, err
        data = json.loads(out)
        assert data["frontier"] == [] and data["per_budget"] == []
        assert data["unplaced"] == [row for row in data["results"] if row["strategy"] != "pass@k"]
        assert {row["model"] for row in data["unplaced"]} == {"fake-model"}
        assert not (tmp_path / "frontier.png").exists()
        assert "not placed (FLOPs unknown): fake-model greedy n=1" in (tmp_path / "summary.txt").read_text()


def test_eval_resume_against_another_server_of_the_same_model_id_is_refused(capsys, tmp_path):
    """A served model is filed under its id: another id joins the directory (tests/eval/
    test_model_sweep.py), the same id served by another engine is refused before generating."""
    with FakeServer("vllm", model="model-a") as server:
        assert _run(capsys, *EVAL, "--backend", server.url, "--out", str(tmp_path))[0] == 0
    with FakeServer("sglang", model="model-a") as server:
        code, _, err = _run(capsys, *EVAL, "--backend", server.url, "--out", str(tmp_path))
        assert len(server.posts()) <= 3  # probes only: refused before generating
    assert code == 2 and "model.engine='vllm'" in err and "model.engine='sglang'" in err


@pytest.mark.slow
def test_generate_and_eval_on_a_real_llama_cpp_server(capsys, tmp_path, llama_server):  # noqa: F811
    from metagen.models import embedded_model_path

    code, out, err = _run(capsys, "generate", "--backend", llama_server, "What is 2+2?", "--temperature", "0",
                          "--json", "--max-tokens", "8")
    assert code == 0, err
    payload = json.loads(out)
    assert isinstance(payload["text"], str) and payload["finish_reason"] in ("stop", "length")
    assert payload["cost"]["model_calls"] == 1 and payload["timing"]["prompt_tokens"] > 0
    code, out, err = _run(capsys, "generate", "--backend", llama_server, "What is 2+2?", "--temperature", "0",
                          "--json", "--max-tokens", "8", "--no-chat")
    assert code == 0, err
    # the default went through the server's chat template (its role markers), --no-chat sent the text alone
    assert json.loads(out)["timing"]["prompt_tokens"] + 10 < payload["timing"]["prompt_tokens"]
    argv = [*EVAL, "--backend", llama_server, "--tokenizer", str(embedded_model_path()), "--concurrency", "2",
            "--out", str(tmp_path), "--json"]
    code, out, err = _run(capsys, *argv)
    assert code == 0, err
    first = (tmp_path / "results.jsonl").read_bytes()
    records = [json.loads(line) for line in first.splitlines()]
    keys = [(r["kind"], r["id"], r.get("strategy"), r.get("n")) for r in records if r["kind"] != "setup"]
    assert len(keys) == len(set(keys)) == 4 + 4  # a pool and a greedy record per problem
    assert records[0]["setup"]["model"]["engine"] == "llama.cpp"
    code, again, err = _run(capsys, *argv)
    assert code == 0, err
    assert (tmp_path / "results.jsonl").read_bytes() == first
    assert _timeless(again) == _timeless(out)
