"""Broken checkpoints give a ValueError naming the file and what is wrong (the CLI prints it as
one line), never a traceback from numpy, gguf or a KeyError: truncated or empty GGUF files,
GGUFs without required metadata, and HF directories whose config.json is empty, not JSON, or
misses or mistypes a required field."""

import json

import pytest

from metagen.cli import main
from metagen.models import embedded_model_path, load


@pytest.fixture(scope="module")
def truncated_gguf(tmp_path_factory):
    """The embedded GGUF cut at 50 MB (its tensor data ends at its full size, ~98 MB)."""
    path = tmp_path_factory.mktemp("gguf") / "truncated.gguf"
    with open(embedded_model_path(), "rb") as source:
        path.write_bytes(source.read(50_000_000))
    return path


def test_truncated_gguf_names_the_file_its_size_and_the_expected_size(truncated_gguf, temp_cache):
    expected = embedded_model_path().stat().st_size
    message = f"{truncated_gguf} is truncated: it has 50,000,000 bytes, but its tensor data needs {expected:,} bytes"
    with pytest.raises(ValueError, match=message):
        load(truncated_gguf)


@pytest.mark.parametrize("size", [0, 7, 1000])  # empty; inside the header; inside the metadata
def test_gguf_cut_before_its_tensor_table_names_the_file(size, tmp_path, temp_cache):
    path = tmp_path / "cut.gguf"
    with open(embedded_model_path(), "rb") as source:
        path.write_bytes(source.read(size))
    with pytest.raises(ValueError, match=f"{path} \\({size:,} bytes\\) is not a readable GGUF file"):
        load(path)


def test_gguf_without_required_metadata_names_the_field(tmp_path, temp_cache):
    from gguf import GGUFWriter

    path = tmp_path / "bare.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=f"{path} lacks the GGUF metadata field 'llama.attention.head_count'"):
        load(path)


@pytest.mark.parametrize("argv", [["info"], ["generate", "hi", "--max-tokens", "1"]])
def test_cli_prints_one_line_naming_the_truncated_file(argv, truncated_gguf, temp_cache, capsys):
    assert main([*argv, "--model", str(truncated_gguf)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"metagen: error: {truncated_gguf} is truncated") and "\n" not in error


def test_cli_speculative_drafter_from_a_truncated_file(truncated_gguf, tiny_checkpoint, temp_cache, capsys):
    argv = ["generate", "hi", "--model", str(tiny_checkpoint), "--dtype", "fp32", "--max-tokens", "1",
            "--speculative", f"model:{truncated_gguf}"]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(f"metagen: error: {truncated_gguf} is truncated")


def hf_directory(tmp_path, config_text: str):
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(config_text)
    return directory


@pytest.mark.parametrize(
    "config, message",
    [
        ({}, "is missing the required field 'num_attention_heads'"),
        ({"num_attention_heads": 4}, "is missing the required field 'vocab_size'"),
        ({"num_attention_heads": 4, "vocab_size": 8, "hidden_size": 16, "intermediate_size": 32},
         "is missing the required field 'num_hidden_layers'"),
        ({"num_attention_heads": "4"}, "field 'num_attention_heads' is '4', expected a positive integer"),
        ({"num_attention_heads": 0}, "field 'num_attention_heads' is 0, expected a positive integer"),
        ({"num_attention_heads": 4, "num_key_value_heads": -2, "vocab_size": 8, "hidden_size": 16,
          "intermediate_size": 32, "num_hidden_layers": 1}, "field 'num_key_value_heads' is -2"),
    ],
)
def test_hf_config_missing_or_mistyped_field_is_named(config, message, tmp_path, temp_cache):
    directory = hf_directory(tmp_path, json.dumps(config))
    with pytest.raises(ValueError) as error:
        load(directory)
    assert str(error.value).startswith(str(directory / "config.json")) and message in str(error.value)


@pytest.mark.parametrize(
    "text, message",
    [("", "is not valid JSON: Expecting value (line 1, column 1)"),
     ('{"vocab_size": 8,\n', "is not valid JSON: Expecting property name enclosed in double quotes (line 2, column 1)"),
     ("[1, 2]", "must hold a JSON object, not list")],
)
def test_hf_config_that_is_not_a_json_object_is_named(text, message, tmp_path, temp_cache):
    directory = hf_directory(tmp_path, text)
    with pytest.raises(ValueError) as error:
        load(directory)
    assert str(error.value) == f"{directory / 'config.json'} {message}"


def test_cli_prints_the_missing_field(tmp_path, temp_cache, capsys):
    directory = hf_directory(tmp_path, "{}")
    assert main(["info", "--model", str(directory)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"metagen: error: {directory / 'config.json'} is missing the required field 'num_attention_heads'"
    )


def test_checkpoint_missing_tensors_names_them(tiny_checkpoint, tmp_path, temp_cache):
    import shutil

    from safetensors.torch import load_file, save_file

    directory = tmp_path / "incomplete"
    shutil.copytree(tiny_checkpoint, directory)
    [weights] = directory.glob("*.safetensors")
    tensors = load_file(str(weights))
    del tensors["model.layers.1.mlp.down_proj.weight"], tensors["model.norm.weight"]
    save_file(tensors, str(weights))
    with pytest.raises(ValueError, match=r"incomplete is missing tensors a llama model needs: norm, layers\.1\.down"):
        load(directory, "fp32")
