"""Hub names (`models/hub.py`): `OWNER/NAME[:QUANT]` through `metagen.load`, `metagen generate`,
`metagen eval` and `metagen serve`, offline (HF_HUB_OFFLINE=1) against a hub cache written by
huggingface_hub's own cache functions and read back by its `scan_cache_dir`; the embedded GGUF
stands for a downloaded quantization, so a hub name must give exactly the local file's text."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import metagen
from metagen.cli import main
from metagen.models import embedded_model_path
from metagen.models.hub import HubName, parse_hub_name, resolve

hub = pytest.importorskip("huggingface_hub")
from huggingface_hub import constants  # noqa: E402

GGUF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
GGUF_FILE = "smollm2-135m-instruct-q4_1.gguf"
PROMPT = "What is the capital of France?"


def _etag(path: Path) -> str:
    """The name the Hub gives a file's blob: the sha256 of an LFS file (weights), the git blob id of another."""
    data = path.read_bytes()
    if path.suffix in (".gguf", ".safetensors"):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def cache_repo(cache: Path, repo_id: str, files: dict[str, Path]) -> dict[str, Path]:
    """Put `files` (name in the repository -> a local file) into the hub cache `cache` as
    `hf_hub_download` stores a download (`file_download._hf_hub_download_to_cache_dir`): the blob
    under its etag, the snapshot's file a relative symlink to it (`_create_symlink`), refs/main
    naming the commit (`_cache_commit_hash_for_specific_revision`). A blob links to the local
    file instead of holding a copy, as a blob of the library's shared store does. The library's
    `scan_cache_dir` must then read the repository back: {name: its path in the snapshot}."""
    from huggingface_hub.file_download import (_cache_commit_hash_for_specific_revision, _create_symlink,
                                               repo_folder_name)

    storage = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    for name, source in files.items():
        blob = storage / "blobs" / _etag(source)
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            os.symlink(source.resolve(), blob)
        pointer = storage / "snapshots" / commit / name
        pointer.parent.mkdir(parents=True, exist_ok=True)
        _create_symlink(str(blob), str(pointer), new_blob=True)
    _cache_commit_hash_for_specific_revision(str(storage), "main", commit)
    scanned = hub.scan_cache_dir(cache)
    assert not scanned.warnings, scanned.warnings
    (repo,) = [repo for repo in scanned.repos if repo.repo_id == repo_id]
    (revision,) = repo.revisions
    assert (repo.repo_type, revision.commit_hash, set(revision.refs)) == ("model", commit, {"main"})
    paths = {file.file_path.relative_to(revision.snapshot_path).as_posix(): file.file_path for file in revision.files}
    assert set(paths) == set(files)
    return paths


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty hub cache, offline, for this process (huggingface_hub reads both variables when
    imported) and for the commands it starts (the environment)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture
def gguf_repo(hub_cache) -> Path:
    """GGUF_REPO in the cache with one GGUF, the embedded model's file; its path in the snapshot."""
    files = cache_repo(hub_cache, GGUF_REPO, {GGUF_FILE: embedded_model_path(), "README.md": Path(__file__)})
    return files[GGUF_FILE]


def test_the_grammar_separates_hub_names_from_paths():
    assert parse_hub_name("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M") == HubName(
        "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "Q4_K_M")
    assert parse_hub_name("HuggingFaceTB/SmolLM2-135M-Instruct") == HubName("HuggingFaceTB/SmolLM2-135M-Instruct",
                                                                            None)
    assert parse_hub_name("unsloth/x-GGUF:UD-Q4_K_XL") == HubName("unsloth/x-GGUF", "UD-Q4_K_XL")
    for path in ["models/x.gguf", "./a/b", "/a/b", "a/b/c", "~/a", "model.gguf", "a/b:", "a/b:c:d", ".a/b"]:
        assert parse_hub_name(path) is None, path
    assert parse_hub_name(Path("a/b")) is None  # a pathlib value is a path


def test_one_gguf_needs_no_tag_and_a_tag_selects_it(gguf_repo):
    assert resolve(GGUF_REPO) == (gguf_repo, None)
    assert resolve(GGUF_REPO + ":Q4_1") == (gguf_repo, None)
    assert resolve(GGUF_REPO + ":q4_1") == (gguf_repo, None)  # any case, as llama.cpp
    with pytest.raises(ValueError) as error:
        resolve(GGUF_REPO + ":Q8_0")
    message = str(error.value)
    assert message.startswith(f"model '{GGUF_REPO}:Q8_0': no GGUF file of {GGUF_REPO} (its cached files only: "
                              "HF_HUB_OFFLINE is set) has 'Q8_0' in its name; tags: q4_1 (files: "
                              f"{GGUF_FILE})")
    assert f"`hf download {GGUF_REPO} --include '*Q8_0*'`" in message


@pytest.fixture
def quants_repo(hub_cache, tmp_path) -> dict[str, Path]:
    """A repository of four quantizations, one of them split in two parts, and a vision projector."""
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + bytes(64))
    names = ["x-Q4_1.gguf", "x-UD-Q4_1.gguf", "x-Q4_K_M.gguf", "x-Q8_0-00001-of-00002.gguf",
             "x-Q8_0-00002-of-00002.gguf", "mmproj-x-f16.gguf"]
    return cache_repo(hub_cache, "owner/x-GGUF", {name: embedded_model_path() if name == "x-Q4_K_M.gguf" else other
                                                 for name in names})


def test_the_tag_picks_the_file_whose_name_holds_it_as_a_whole_word(quants_repo):
    assert resolve("owner/x-GGUF:q4_k_m") == (quants_repo["x-Q4_K_M.gguf"], None)
    assert resolve("owner/x-GGUF:UD-Q4_1") == (quants_repo["x-UD-Q4_1.gguf"], None)
    listing = ("tags: Q4_1, Q4_K_M, Q8_0 (files: x-Q4_1.gguf, x-Q4_K_M.gguf, x-Q8_0-00001-of-00002.gguf (+1 parts), "
               "x-UD-Q4_1.gguf)")
    with pytest.raises(ValueError) as error:  # Q4_K is part of Q4_K_M, not a word of it
        resolve("owner/x-GGUF:Q4_K")
    assert str(error.value) == ("model 'owner/x-GGUF:Q4_K': no GGUF file of owner/x-GGUF (its cached files only: "
                                f"HF_HUB_OFFLINE is set) has 'Q4_K' in its name; {listing}; download it first with "
                                "`hf download owner/x-GGUF --include '*Q4_K*'` (`huggingface-cli download` with "
                                "huggingface_hub < 1.0)")
    with pytest.raises(ValueError) as error:
        resolve("owner/x-GGUF:Q4_1")
    assert str(error.value) == ("model 'owner/x-GGUF:Q4_1': the tag 'Q4_1' matches 2 GGUF models of owner/x-GGUF "
                                "(its cached files only: HF_HUB_OFFLINE is set): x-Q4_1.gguf, x-UD-Q4_1.gguf; give a "
                                f"longer tag that names one, {listing}")
    with pytest.raises(ValueError) as error:
        resolve("owner/x-GGUF")
    assert str(error.value) == ("model 'owner/x-GGUF': owner/x-GGUF (its cached files only: HF_HUB_OFFLINE is set) "
                                f"holds 4 GGUF models; choose one with owner/x-GGUF:QUANT, {listing}")


def test_a_split_gguf_is_refused_with_the_command_that_merges_it(quants_repo):
    with pytest.raises(NotImplementedError) as error:
        resolve("owner/x-GGUF:Q8_0")
    assert str(error.value) == (
        "model 'owner/x-GGUF:Q8_0': x-Q8_0-00001-of-00002.gguf is split in 2 files, and metagen reads single-file "
        "GGUF: download them (hf download owner/x-GGUF x-Q8_0-00001-of-00002.gguf x-Q8_0-00002-of-00002.gguf), "
        "merge them with llama.cpp's `llama-gguf-split --merge x-Q8_0-00001-of-00002.gguf merged.gguf` and pass "
        "--model merged.gguf")


def test_offline_without_the_files_in_the_cache_says_how_to_fetch_them(hub_cache, capsys):
    with pytest.raises(FileNotFoundError) as error:
        resolve("nobody/missing-GGUF:Q4_K_M")
    assert str(error.value) == (
        f"model 'nobody/missing-GGUF:Q4_K_M': no such file or directory, and nobody/missing-GGUF is not in the "
        f"Hugging Face cache {hub_cache} (HF_HUB_OFFLINE is set): download it first with `hf download "
        "nobody/missing-GGUF --include '*Q4_K_M*'` (`huggingface-cli download` with huggingface_hub < 1.0)")
    assert main(["generate", PROMPT, "--model", "nobody/missing-GGUF"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("metagen: error: model 'nobody/missing-GGUF': no such file or directory, and ")
    assert err.count("\n") == 1 and "`hf download nobody/missing-GGUF` (" in err


def test_an_invalid_repository_id_is_refused_before_any_request(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # online: the id is checked before it is sent
    with pytest.raises(ValueError) as error:
        resolve("owner/a..b:Q4_0")
    assert str(error.value) == ("model 'owner/a..b:Q4_0': no such file or directory, nor a valid Hub repository id "
                                "(Cannot have -- or .. in repo_id: 'owner/a..b'.)")


def test_without_huggingface_hub_a_hub_name_asks_for_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` fails
    with pytest.raises(ValueError) as error:
        resolve("owner/name:Q4_K_M")
    assert str(error.value) == ("model 'owner/name:Q4_K_M' is a Hugging Face Hub name, which needs huggingface_hub, "
                                "a dependency of metagen that is not installed here: pip install 'huggingface_hub>=0.23'")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "owner").mkdir()
    (tmp_path / "owner" / "name").write_bytes(b"")
    assert resolve("owner/name") == (Path("owner/name"), None)  # an existing path needs no hub


def test_importing_metagen_and_its_loader_imports_no_huggingface_hub():
    code = ("import sys, metagen, metagen.cli, metagen.models.hub\nfrom metagen.models import load\n"
            "metagen.models.hub.parse_hub_name('a/b:Q4_K_M')\nprint('huggingface_hub' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(Path(metagen.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.strip() == "False", done.stderr[-2000:]


def test_an_existing_local_path_wins_over_the_hub_name(gguf_repo, tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_checkpoint, tmp_path / GGUF_REPO)  # ./OWNER/NAME: the tiny 2-layer Llama directory
    model = metagen.load(GGUF_REPO, "fp32", use_cache=False)
    assert model.config.num_hidden_layers == 2 and model.source == GGUF_REPO


@pytest.fixture
def safetensors_repo(hub_cache, tiny_checkpoint, tmp_path) -> str:
    """A tiny random Llama written by transformers' `save_pretrained` (safetensors) with the
    embedded model's tokenizer, cached as owner/tiny-llama."""
    transformers = pytest.importorskip("transformers")
    import torch

    directory = tmp_path / "tiny-llama"
    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory, safe_serialization=True)
    for item in tiny_checkpoint.iterdir():
        if item.name.startswith("tokenizer") or item.suffix == ".jinja":
            shutil.copy(item, directory / item.name)
    files = {item.name: item for item in directory.iterdir()} | {"README.md": Path(__file__)}
    assert "model.safetensors" in files and "config.json" in files
    cache_repo(hub_cache, "owner/tiny-llama", files)
    return directory


def test_a_safetensors_repository_loads_as_an_hf_directory(safetensors_repo):
    import torch

    model = metagen.load("owner/tiny-llama", "fp32", use_cache=False)
    local = metagen.load(safetensors_repo, "fp32", use_cache=False)
    assert model.name == "owner/tiny-llama"  # not the snapshot directory's commit
    assert Path(model.source).parent.name == "snapshots"
    ids = list(range(5, 60, 3))
    expected = local.forward(local.new_cache(1), [ids], logits="all").logits
    torch.testing.assert_close(model.forward(model.new_cache(1), [ids], logits="all").logits, expected,
                               atol=0, rtol=0)
    with pytest.raises(ValueError, match="holds no GGUF file for the tag :Q4_K_M to select"):
        metagen.load("owner/tiny-llama:Q4_K_M")


@pytest.mark.slow
def test_load_by_hub_name_gives_the_local_files_text(gguf_repo, model):
    from metagen.sampling import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=12)
    by_name = metagen.load(GGUF_REPO + ":Q4_1")
    assert by_name.source == str(gguf_repo)
    assert metagen.generate(by_name, PROMPT, params).text == metagen.generate(model, PROMPT, params).text


@pytest.mark.slow
def test_cli_generate_by_hub_name_offline_gives_the_local_files_text(gguf_repo, model):
    """A fresh `metagen generate` process reads HF_HUB_OFFLINE and HF_HUB_CACHE from its environment."""
    from metagen.sampling import SamplingParams

    env = {**os.environ, "PYTHONPATH": str(Path(metagen.__file__).parents[1])}
    command = [sys.executable, "-m", "metagen.cli", "generate", PROMPT, "--model", GGUF_REPO, "--temperature", "0",
               "--max-tokens", "12", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = metagen.generate(model, PROMPT, SamplingParams(temperature=0, max_tokens=12)).completions[0]
    assert json.loads(done.stdout)["text"] == expected.text


@pytest.mark.slow
def test_eval_sweeps_a_local_path_and_a_hub_name(gguf_repo, capsys):
    argv = ["eval", "--task", "arithmetic", "--count", "2", "--strategy", "greedy", "--n", "1", "--max-tokens", "8",
            "--temperature", "0", "--json", "--model", str(embedded_model_path()), "--model", GGUF_REPO + ":Q4_1"]
    assert main(argv) == 0, capsys.readouterr().err
    rows = {row["model"]: row for row in json.loads(capsys.readouterr().out)["results"]}
    assert set(rows) == {"SmolLM2-135M-Instruct.Q4_1", "SmolLM2-135M-Instruct-GGUF:Q4_1"}
    local, named = rows.values()
    assert (local["accuracy"], local["cost"]["generated_tokens"]) == (named["accuracy"],
                                                                      named["cost"]["generated_tokens"])


def test_eval_fails_on_a_missing_hub_model_before_loading_any(hub_cache, capsys, monkeypatch):
    from metagen.cli import common

    loaded = []
    monkeypatch.setattr(common, "load_model", lambda args: loaded.append(args.model))
    argv = ["eval", "--task", "arithmetic", "--count", "2", "--strategy", "greedy", "--n", "1", "--model",
            str(embedded_model_path()), "--model", "nobody/missing-GGUF"]
    assert main(argv) == 2
    assert loaded == []
    assert "model 'nobody/missing-GGUF': no such file or directory, and nobody/missing-GGUF is not in the " \
           "Hugging Face cache" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_by_hub_name_answers_as_the_local_file(gguf_repo, model):
    from metagen.sampling import SamplingParams
    from tests.serve.server import serve_process

    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import urllib.request

    with serve_process("--model", GGUF_REPO + ":Q4_1", "--no-prefix-cache") as server:  # the environment: offline
        served = json.loads(server.get("/v1/models"))["data"][0]["id"]
        body = json.dumps({"model": served, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}).encode()
        request = urllib.request.Request(server.url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            text = json.loads(answer.read())["choices"][0]["text"]
    assert served == model.name
    assert text == metagen.generate(model, PROMPT, SamplingParams(temperature=0, max_tokens=12), chat=False).text
