"""The checkpoint readers name no family: what only some families' files do is data on their
`Family` (models/families/), which the readers consult."""

import re
from pathlib import Path

import pytest

import metagen.models.families as registry
from metagen.models.families import family_for

SOURCE = Path(registry.__file__).resolve().parents[1]
READERS = ("gguf_reader.py", "hf_reader.py", "weights.py")


def family_names() -> set[str]:
    """Every name the registry knows a family by: architecture, GGUF and HF names, and the HF
    model types a family refuses."""
    family_for("llama", "the registry")  # fills registry.FAMILIES
    names = set()
    for family in registry.FAMILIES.values():
        names |= {family.architecture, family.gguf_name, family.hf_model_type or "", *family.hf_refused_model_types}
    return names - {""}


def name_pattern(name: str) -> re.Pattern:
    """`name` as prose or code writes it: any case, its letter and digit runs joined by nothing, a
    space, a hyphen or an underscore ("qwen2_moe": Qwen2-MoE, qwen2moe; "gemma3": Gemma 3), as a
    whole word; llama.cpp, the tool, is not the family."""
    pieces = re.findall(r"[a-z]+|\d+", name.lower())
    return re.compile(r"(?<![a-z0-9])" + r"[\s_-]?".join(pieces) + r"(?![a-z0-9])(?!\.cpp)", re.IGNORECASE)


def test_the_pattern_finds_a_family_however_it_is_written():
    assert name_pattern("qwen2_moe").search("# qkv_bias: Qwen2-MoE")
    assert name_pattern("qwen2").search("Qwen2/3 write a sliding_window")
    assert name_pattern("gemma3").search('raw.get("model_type") == "gemma3"')
    assert name_pattern("gemma3").search("# Gemma 3 keeps one dict per layer kind")
    assert name_pattern("llama").search("llama.cpp stores Llama-style Q/K interleaved")
    assert not name_pattern("llama").search("llama.cpp's converter")
    assert not name_pattern("qwen2").search("qwen2moe") and not name_pattern("phi3").search("alpha3")


@pytest.mark.parametrize("module", READERS)
def test_the_readers_name_no_family(module):
    text = (SOURCE / module).read_text(encoding="utf-8")
    named = sorted(name for name in family_names() if name_pattern(name).search(text))
    assert not named, f"models/{module} names the families {named}: make it a field of `Family` instead"
