"""Models by their Hugging Face Hub names: `--model OWNER/NAME[:QUANT]` and `metagen.load("OWNER/NAME")`.

The grammar, llama.cpp's `-hf` one:

    OWNER/NAME          a repository with exactly one GGUF model; or, without GGUF files, one with
                        config.json and *.safetensors, loaded as an HF directory (tokenizer.json,
                        tokenizer_config.json, generation_config.json come along)
    OWNER/NAME:QUANT    the GGUF model whose file name contains QUANT as a whole word, in any case:
                        Q4_K_M, q8_0, IQ4_XS, BF16, UD-Q4_K_XL (Q4_K names neither Q4_K_M nor Q4_K_S)

OWNER and NAME are spelled as Hub repository ids are (letters, digits, `-`, `_`, `.`). A string
naming an existing file or directory is always that path, and a `pathlib.Path`, a value ending
in `.gguf` or one shaped otherwise (`./x`, `/x`, `a/b/c`) is always a path. A GGUF model split in
parts (`-00001-of-00003.gguf`) counts as one model; metagen reads single files, so it is refused
with the command that merges it. A tag that selects no model, or several, is refused with the
repository's GGUF files and their tags; `mmproj-*` files (vision projectors) are not models.

Files come through `huggingface_hub` (a core dependency, imported only here, only for
a hub name) with its cache (HF_HUB_CACHE, HF_HOME), its token (HF_TOKEN, `hf auth login`) and
HF_HUB_OFFLINE. Online the repository's file list comes from the Hub and the chosen files are
downloaded (or found current in the cache); offline, or when the Hub cannot be reached, the list
is the cached snapshot of the main branch (`scan_cache_dir`), so the files must have been
downloaded before (`hf download OWNER/NAME`).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path

_NAME = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?::(?P<tag>[\w.-]+))?")
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)  # a part of a split GGUF model
# the quantization at the end of a GGUF file's stem, listed as the tags to choose from
_QUANT = re.compile(r"(?:^|[-._])((?:I?Q|TQ)\d+(?:_[A-Z0-9]+)*|B?F16|F32|MXFP4(?:_MOE)?)$", re.IGNORECASE)
# what an HF directory needs besides *.safetensors (hf_reader.read_hf_directory, Tokenizer.from_hf_dir)
HF_DIRECTORY_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                      "special_tokens_map.json", "chat_template.jinja")


@dataclass(frozen=True)
class HubName:
    repo_id: str
    tag: str | None  # the GGUF quantization to pick, None when the repository has one model


def parse_hub_name(value: str | os.PathLike) -> HubName | None:
    """The hub name a --model value spells, or None when it reads as a path (see the module docstring)."""
    if not isinstance(value, str) or value.lower().endswith(".gguf"):
        return None
    match = _NAME.fullmatch(value)
    return None if match is None else HubName(match["repo"], match["tag"])


def resolve(value: str | os.PathLike) -> tuple[Path, str | None]:
    """(checkpoint path, name) of a model value: an existing path, or a value that is no hub name,
    as it is (name None); a hub name's GGUF file or snapshot directory in the hub cache, downloaded
    when needed, and for a directory the repository id as its name (the directory is named by
    its commit)."""
    name = parse_hub_name(value)
    if name is None or Path(value).exists():
        return Path(value), None
    try:
        import huggingface_hub
    except ImportError:
        from metagen.extras import core_requirement

        raise ValueError(f"model {value!r} is a Hugging Face Hub name, which needs huggingface_hub, a dependency "
                         f"of metagen that is not installed here: {core_requirement('huggingface_hub')}") from None
    files, offline = _repo_files(huggingface_hub, value, name)
    models = _gguf_models(files)
    if models or name.tag is not None:
        parts = _choose_gguf(value, name, models, offline)
        if len(parts) > 1:
            raise NotImplementedError(
                f"model {value!r}: {parts[0]} is split in {len(parts)} files, and metagen reads single-file GGUF: "
                f"download them (hf download {name.repo_id} {' '.join(parts)}), merge them with llama.cpp's "
                f"`llama-gguf-split --merge {Path(parts[0]).name} merged.gguf` and pass --model merged.gguf")
        return Path(_download(huggingface_hub, value, name, parts, offline)) / parts[0], None
    weights = [file for file in files if "/" not in file and file.endswith(".safetensors")]
    if "config.json" not in files or not weights:
        raise ValueError(f"model {value!r}: {_where(name, offline)} holds no GGUF file and no config.json with "
                         f"*.safetensors weights to load: {', '.join(files) or 'no files'}")
    wanted = weights + [file for file in files
                        if file in HF_DIRECTORY_FILES or file.endswith(".safetensors.index.json")]
    return Path(_download(huggingface_hub, value, name, wanted, offline)), name.repo_id


def _repo_files(hub, value: str, name: HubName) -> tuple[list[str], str | None]:
    """The repository's files and None; offline, or when the Hub cannot be reached, the files of
    its cached main snapshot and the reason the Hub was not asked."""
    from huggingface_hub import constants
    from huggingface_hub.utils import HFValidationError, RepositoryNotFoundError

    if constants.HF_HUB_OFFLINE:
        offline = "HF_HUB_OFFLINE is set"
    else:
        try:
            siblings = hub.model_info(name.repo_id).siblings or []  # one request, no retries when unreachable
            return sorted(sibling.rfilename for sibling in siblings), None
        except HFValidationError as error:
            raise ValueError(f"model {value!r}: no such file or directory, nor a valid Hub repository id ({error})") \
                from None
        except RepositoryNotFoundError as error:  # also a gated repository, or a private one without a token
            raise FileNotFoundError(f"model {value!r}: no such file or directory, nor a Hub repository this token "
                                    f"can read ({_first_line(error)}); a private or gated one needs HF_TOKEN or "
                                    "`hf auth login`") from None
        except Exception as error:  # noqa: BLE001 - no network or the Hub down: the cache may hold the files
            offline = f"the Hub could not be reached: {type(error).__name__}: {_first_line(error)}"
    try:
        cache = hub.scan_cache_dir(constants.HF_HUB_CACHE)
        repos = cache.repos
    except hub.CacheNotFound:
        repos = frozenset()
    for repo in repos:
        if repo.repo_id == name.repo_id and repo.repo_type == "model":
            for revision in repo.revisions:
                if "main" in revision.refs:
                    return sorted(file.file_path.relative_to(revision.snapshot_path).as_posix()
                                  for file in revision.files), offline
    raise FileNotFoundError(f"model {value!r}: no such file or directory, and {name.repo_id} is not in the Hugging "
                            f"Face cache {constants.HF_HUB_CACHE} ({offline}): download it first with "
                            f"{_download_command(name)}")


def _gguf_models(files: list[str]) -> dict[str, list[str]]:
    """{model: its files in order} of the GGUF files; a split model's parts are one model, named
    by its path without the part suffix."""
    models: dict[str, list[str]] = {}
    for file in sorted(files):
        base = file.rsplit("/", 1)[-1].lower()
        if base.endswith(".gguf") and not base.startswith("mmproj"):
            split = _SPLIT.search(file)
            models.setdefault(file[:split.start()] if split else file[: -len(".gguf")], []).append(file)
    return models


def _choose_gguf(value: str, name: HubName, models: dict[str, list[str]], offline: str | None) -> list[str]:
    """The files of the one GGUF model `name` selects; ValueError listing the models and their tags
    when it selects none or several."""
    where = _where(name, offline)
    if not models:
        raise ValueError(f"model {value!r}: {where} holds no GGUF file for the tag :{name.tag} to select; without a "
                         f"tag a repository of config.json and *.safetensors loads as an HF directory")
    if name.tag is None:
        if len(models) == 1:
            return next(iter(models.values()))
        raise ValueError(f"model {value!r}: {where} holds {len(models)} GGUF models; choose one with "
                         f"{name.repo_id}:QUANT, {_listing(models)}")
    whole_word = re.compile(rf"(?<![A-Za-z0-9]){re.escape(name.tag)}(?![A-Za-z0-9_])", re.IGNORECASE)
    chosen = [model for model in models if whole_word.search(model.rsplit("/", 1)[-1])]
    if len(chosen) == 1:
        return models[chosen[0]]
    if chosen:
        raise ValueError(f"model {value!r}: the tag {name.tag!r} matches {len(chosen)} GGUF models of {where}: "
                         f"{', '.join(_shown(model, models[model]) for model in chosen)}; give a longer tag that "
                         f"names one, {_listing(models)}")
    fetch = f"; download it first with {_download_command(name)}" if offline else ""
    raise ValueError(f"model {value!r}: no GGUF file of {where} has {name.tag!r} in its name; "
                     f"{_listing(models)}{fetch}")


def _download(hub, value: str, name: HubName, files: list[str], offline: str | None) -> str:
    """The snapshot directory holding `files` (downloaded now, or found in the cache)."""
    from huggingface_hub.utils import LocalEntryNotFoundError

    try:
        return hub.snapshot_download(name.repo_id, allow_patterns=[glob.escape(file) for file in files])
    except LocalEntryNotFoundError as error:  # offline, and a file of the listing is not in the cache
        raise FileNotFoundError(f"model {value!r}: {', '.join(files)} of {name.repo_id} are not all in the Hugging "
                                f"Face cache ({offline or error}): download them first with "
                                f"{_download_command(name)}") from None


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [""])[0]


def _where(name: HubName, offline: str | None) -> str:
    return name.repo_id if offline is None else f"{name.repo_id} (its cached files only: {offline})"


def _shown(model: str, parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{parts[0]} (+{len(parts) - 1} parts)"


def _listing(models: dict[str, list[str]]) -> str:
    """"tags: Q4_K_M, Q8_0 (files: a-Q4_K_M.gguf, a-Q8_0.gguf)"."""
    tags = []
    for model in models:
        stem = model.rsplit("/", 1)[-1]
        quant = _QUANT.search(stem)
        tags.append(quant.group(1) if quant else stem)
    files = ", ".join(_shown(model, parts) for model, parts in models.items())
    return f"tags: {', '.join(dict.fromkeys(tags))} (files: {files})"


def _download_command(name: HubName) -> str:
    include = f" --include '*{name.tag}*'" if name.tag else ""
    return f"`hf download {name.repo_id}{include}` (`huggingface-cli download` with huggingface_hub < 1.0)"
