"""The table of drafters and verification rules: every entry builds by name (drafters on the
embedded model, proposing a valid chain `Draft`), unknown names and options an entry does not
read are refused by name before any model loads, the help and the speculative guide list what
the table holds."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import torch

from metagen.cli import build_parser, main
from metagen.decoding.draft_loop import check_draft
from metagen.decoding.drafts import Draft, Verification
from metagen.sampling import SamplerChain, SamplingParams
from metagen.speculative import SpeculativeConfig, SpeculativeGenerator
from metagen.speculative.registry import (
    DRAFTERS,
    VERIFICATIONS,
    DrafterOptions,
    check_drafter,
    check_speculative,
    check_verification,
    drafter_names,
    make_drafter,
    make_verification,
)

ROOT = Path(__file__).resolve().parents[2]
# options each entry is built with below (small, fast); a new entry needs its line here
EXAMPLES = {"ngram": {}, "early-exit": {"exit_layer": 4}, "quantized": {"draft_dtype": "int4"},
            "model": {"draft_dtype": "int4", "confidence": 0.0}, "tree": {"exit_layer": 4, "tree_widths": (2, 1), "tree_nodes": 3},
            "spectr": {"exit_layer": 4, "tree_widths": (2, 1), "tree_nodes": 3}, "dyspec": {"exit_layer": 4, "tree_nodes": 4},
            "recycling": {"tree_widths": (2, 1), "tree_nodes": 3}, "rasd": {"tree_nodes": 4},
            "rasd-tree": {"exit_layer": 4, "tree_widths": (2, 1), "tree_nodes": 5},
            "stand": {"tree_widths": (2, 1), "tree_nodes": 3}, "pearl": {"draft_dtype": "int4"},
            "s2d": {"exit_layer": 4, "confidence": 0.5}, "medusa": {"tree_widths": (2, 1), "tree_nodes": 3}}


def test_every_drafter_has_an_example_and_reads_only_known_options():
    assert set(EXAMPLES) == set(DRAFTERS)
    assert drafter_names() == ["ngram", "early-exit", "quantized", "model:PATH", "tree", "spectr", "dyspec",
                               "recycling", "rasd", "rasd-tree", "stand", "pearl:DRAFT", "s2d", "medusa:PATH"]
    for name, spec in DRAFTERS.items():
        assert spec.description and set(EXAMPLES[name]) <= set(spec.reads), name


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_every_drafter_builds_by_name_and_proposes_a_valid_draft(model_fp32, name, tmp_path):
    """An fp32 target (so an int4 copy of it is cheaper); the prompt repeats, so n-gram lookup
    proposes too. The drafter sees the target's logits over the prompt (`observe`: token
    recycling learns from them). The draft is checked as the loop checks it, and its
    distributions are the sampled chain's (rows summing to 1) or point masses."""
    target = model_fp32
    spelling = f"{name}:{target.source}" if DRAFTERS[name].argument else name
    if name == "medusa":  # untrained heads (y = h): the LM head's top tokens at every depth
        from metagen.speculative.adapter import model_identity
        from metagen.speculative.medusa import MedusaHeads

        MedusaHeads(2, model_identity(target)).save(tmp_path / "heads.safetensors")
        spelling = f"medusa:{tmp_path / 'heads.safetensors'}"
    drafter = make_drafter(spelling, target, **EXAMPLES[name])
    ids = target.tokenizer.encode("one two three four one two three four one two")
    cache = target.new_cache(1)
    # the target's prompt, as the loop leaves it
    out = target.forward(cache, [ids[:-1]], logits="all", hidden=drafter.reads_hidden)
    logits = out.logits
    drafter.start(ids, 2, target_cache=cache)
    drafter.observe([ids[:-1]], logits)
    if drafter.reads_hidden:  # both rows kept nothing and drew ids[-1] after the prompt's last state
        drafter.observe_hidden(out.hidden[:, -1:].expand(2, 1, -1), [([], ids[-1])] * 2)
    chain = SamplerChain.from_params(SamplingParams(temperature=1.0), 2, target.vocab_size)
    if name == "stand":  # it drafts from the committed tokens verification showed it: one observed step first
        drafter.propose([ids[:2]], [0], chain, None)
        logits = target.forward(target.new_cache(1), [ids], logits="all").logits  # (1, T, V)
        # fed t0 = ids[1] and nodes ids[2:-1], all kept, then ids[-1] drawn: position j follows fed[j]
        drafter.observe([ids[1:-1]], logits[:, 1:-1], [(list(range(len(ids) - 3)), ids[-1])])
    contexts = [ids, ids]
    if name == "pearl":  # pre-verify: nothing to verify yet, e_1 drafted meanwhile; once it is kept, D follows
        assert drafter.propose(contexts, [3, 2], chain, torch.Generator().manual_seed(0)).tokens == [[], []]
        firsts = [token for token, _ in drafter.wait()]
        drafter.observe([[ids[-1]], [ids[-1]]], logits, [([], token) for token in firsts])
        contexts = [ids + [token] for token in firsts]
    draft = drafter.propose(contexts, [3, 2], chain, torch.Generator().manual_seed(0))
    drafter.finish([])
    # retrieval trees are chains where every occurrence continues alike (here: the repeats)
    assert isinstance(draft, Draft) and (draft.is_chain != drafter.proposes_trees or name == "rasd")
    check_draft(draft, [3, 2], target.vocab_size, drafter.name, trees=drafter.proposes_trees)
    assert all(draft.tokens), (name, draft.tokens)
    for tokens, probs in zip(draft.tokens, draft.probs):
        if probs is not None:
            assert probs.shape == (len(tokens), target.vocab_size)
            assert torch.allclose(probs.sum(-1), torch.ones(len(tokens)), atol=1e-4)


@pytest.mark.slow
def test_speculative_generator_by_name_runs_the_registered_drafter(model):
    generator = SpeculativeGenerator.by_name(model, "early-exit", SpeculativeConfig(num_draft_tokens=2),
                                             exit_layer=6)
    assert generator.drafter.name == "early-exit" and generator.drafter.model.config.num_hidden_layers == 6
    result = generator.generate("Count: one two three", SamplingParams(temperature=0, max_tokens=6))
    assert len(result.completions[0].token_ids) == 6 and result.cost.draft_tokens > 0


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("eagle", {}, "speculative drafter 'eagle' is unknown: choose one of ngram, early-exit, quantized, "
                      "model:PATH, tree, spectr, dyspec, recycling, rasd, rasd-tree, stand, pearl:DRAFT, s2d, "
                      "medusa:PATH"),
        ("medusa", {}, "'medusa' is unknown"),  # needs medusa:PATH
        ("dyspec", {"tree_widths": (2,)}, r"tree_widths=\(2,\) does not apply to the dyspec drafter \(it reads: "
                                          r"exit_layer, tree_nodes\)"),
        ("model", {}, "'model' is unknown"),  # needs model:PATH
        ("model:", {}, "'model:' is unknown"),
        ("ngram:3", {}, "'ngram:3' is unknown"),  # takes no argument
        ("ngram", {"exit_layer": 4},
         r"exit_layer=4 does not apply to the ngram drafter \(it reads: tree_widths, tree_nodes\)"),
        ("quantized", {"exit_adapter": "a.safetensors"},
         r"exit_adapter='a.safetensors' does not apply to the quantized drafter \(it reads: draft_dtype, confidence, "
         r"stop_head, stop_threshold, tree_widths, tree_nodes\)"),
        ("recycling", {"draft_corpus": "c.txt"},
         r"draft_corpus='c.txt' does not apply to the recycling drafter \(it reads: tree_widths, tree_nodes\)"),
        ("tree", {"draft_corpus": "c.txt"}, r"draft_corpus='c.txt' does not apply to the tree drafter"),
        ("rasd", {"tree_widths": (2,)}, r"tree_widths=\(2,\) does not apply to the rasd drafter"),
    ],
)
def test_unknown_drafters_and_unread_options_are_refused(name, options, message):
    with pytest.raises(ValueError, match=message):
        check_drafter(name, DrafterOptions(**options))
    with pytest.raises(ValueError, match=message):
        make_drafter(name, object(), **options)  # refused before the target is looked at


@pytest.mark.parametrize(
    "options, message",
    [({"exit_layer": 0}, r"exit_layer=0 must be an int >= 1"), ({"draft_dtype": "fp8"}, r"draft_dtype='fp8'"),
     ({"confidence": 1.5}, r"confidence=1.5 is out of range"), ({"tree_widths": (2, 0)}, r"tree_widths=\(2, 0\)"),
     ({"tree_widths": [2]}, r"tree_widths=\[2\] must be a non-empty tuple"), ({"tree_nodes": 0}, r"tree_nodes=0"),
     ({"draft_corpus": ""}, r"draft_corpus='' must be a non-empty path string")],
)
def test_drafter_options_are_range_checked(options, message):
    with pytest.raises(ValueError, match=message):
        DrafterOptions(**options)


def test_every_rule_builds_a_verification_and_says_whether_it_verifies_trees():
    assert list(VERIFICATIONS) == ["token", "block", "draw", "multi-draft", "spectr", "pearl"]
    for name, spec in VERIFICATIONS.items():
        assert spec.description
        verification = make_verification(name)
        assert isinstance(verification, Verification) and verification.trees == spec.trees
        assert SpeculativeConfig(verify=name).verify == name
    assert [name for name, spec in VERIFICATIONS.items() if spec.trees] == ["multi-draft", "spectr"]
    assert [name for name, spec in VERIFICATIONS.items() if spec.iid_siblings] == ["spectr"]
    with pytest.raises(ValueError, match="verify='typical' is not a rule: choose one of token, block, draw, "
                                         "multi-draft, spectr, pearl"):
        check_verification("typical")


def test_a_tree_draft_is_refused_by_the_rules_by_name():
    tree = Draft([[1, 2]], [[-1, -1]], [None])
    for name in ("token", "block", "draw"):
        with pytest.raises(ValueError, match=f"{name} verification verifies chain drafts only"):
            next(make_verification(name).verify(None, torch.zeros(1, 3, 4), tree))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--speculative", "medusa"], "speculative drafter 'medusa' is unknown: choose one of ngram, early-exit"),
        (["--speculative", "ngram", "--draft-dtype", "int8"], "draft_dtype='int8' does not apply to the ngram"),
        (["--speculative", "tree", "--draft-dtype", "int4"], "draft_dtype='int4' does not apply to the tree"),
        (["--speculative", "model:x.gguf", "--exit-layer", "3"], "exit_layer=3 does not apply to the model drafter"),
        (["--speculative", "ngram", "--draft-corpus", "c.txt"], "draft_corpus='c.txt' does not apply to the ngram"),
        (["--speculative", "quantized", "--tree-widths", "2,1", "--verify", "block"],
         "the quantized drafter with tree_widths=(2, 1) proposes token trees, which verify='block' cannot verify"),
        (["--speculative", "early-exit", "--tree-nodes", "6", "--draft-confidence", "0.3"],
         "confidence=0.3 does not apply to tree drafts"),
    ],
)
def test_the_cli_refuses_names_and_options_before_loading(capsys, monkeypatch, tmp_path, argv, message):
    """A --model path that does not exist would be refused at load: the table's error comes first."""
    import metagen.cli.common as common

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(common, "load_model", no_load)
    missing = str(tmp_path / "missing.gguf")
    assert main(["generate", "Hi", "--model", missing, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "does not exist" not in err


def test_the_help_lists_the_tables_names():
    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    actions = {action.dest: action for action in commands.choices["generate"]._actions}
    assert actions["speculative"].help == " | ".join(drafter_names())
    assert list(actions["verify"].choices) == list(VERIFICATIONS)
    assert actions["exit_layer"].help.startswith("early-exit / tree / spectr / dyspec / rasd-tree / pearl:DRAFT / s2d:")
    assert actions["tree_nodes"].help.startswith("ngram / early-exit / quantized / model:PATH / tree / spectr / dyspec / "
                                                 "recycling / rasd / rasd-tree / stand / medusa:PATH:")
    assert actions["draft_stop_head"].help.startswith("early-exit / quantized / model:PATH:")
    assert actions["draft_corpus"].help.startswith("rasd / rasd-tree:")
    assert actions["draft_dtype"].help.startswith("quantized / model:PATH")


def _table_column(page: str, heading: str, column: int) -> list[str]:
    """The code spans of `column` in the first table whose header row starts with `heading`."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {heading} |"))
    cells = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells.append(re.match(r"`([^`]+)`", line.split("|")[column + 1].strip()).group(1))
    return cells


def test_the_speculative_guide_lists_the_table():
    page = (ROOT / "docs" / "guides" / "speculative.md").read_text(encoding="utf-8")
    assert _table_column(page, "`--speculative`", 0) == drafter_names()
    assert _table_column(page, "`--verify`", 0) == list(VERIFICATIONS)


def test_the_tree_drafters_verify_with_a_tree_rule_by_default():
    from metagen.cli.speculative import speculative_options

    def options(*argv):
        return speculative_options(build_parser().parse_args(["generate", "Hi", *argv]))

    trees = {"tree": "multi-draft", "spectr": "spectr", "dyspec": "multi-draft", "recycling": "multi-draft",
             "rasd": "multi-draft", "rasd-tree": "multi-draft", "stand": "multi-draft", "medusa": "multi-draft"}
    for name, rule in trees.items():
        assert DRAFTERS[name].verify == rule and VERIFICATIONS[rule].trees
    assert all(spec.verify == "token" for name, spec in DRAFTERS.items() if name not in trees and name != "pearl")
    assert DRAFTERS["pearl"].verify == "pearl" and options("--speculative", "pearl:early-exit")["config"].verify == "pearl"
    tree = options("--speculative", "tree", "--tree-widths", "3,1", "--tree-nodes", "5")
    assert tree["config"].verify == "multi-draft"
    assert tree["drafter_args"] == {"tree_widths": (3, 1), "tree_nodes": 5}
    assert options("--speculative", "spectr")["config"].verify == "spectr"
    dyspec = options("--speculative", "dyspec", "--tree-nodes", "8")
    assert dyspec["config"].verify == "multi-draft" and dyspec["drafter_args"] == {"tree_nodes": 8}
    assert options("--speculative", "ngram")["config"].verify == "token"
    rasd = options("--speculative", "rasd", "--draft-corpus", "c.txt")
    assert rasd["config"].verify == "multi-draft" and rasd["drafter_args"] == {"draft_corpus": "c.txt"}
    with pytest.raises(ValueError, match="the tree drafter proposes token trees, which verify='token' cannot verify"):
        options("--speculative", "tree", "--verify", "token")


TREE_READERS = ["ngram", "early-exit", "quantized", "model:PATH", "tree"]


def test_tree_options_make_every_drafter_a_tree_drafter_verified_by_the_tree_rule():
    """One table: `tree_widths` / `tree_nodes` given to a drafter reading them choose trees and,
    unless a rule is given, the multi-draft rule; without them the entry's own rule."""
    chain_drafters = [spec.spelling for spec in DRAFTERS.values() if "tree_widths" in spec.reads
                      and (spec.name == "tree" or not VERIFICATIONS[spec.verify].trees)]
    assert chain_drafters == TREE_READERS  # the tree drafters of their own (spectr, recycling, ...) aside
    for spelling in TREE_READERS:
        name = spelling.replace("PATH", "draft.gguf")
        for options in ({"tree_widths": (2, 1)}, {"tree_nodes": 4}):
            assert check_speculative(name, DrafterOptions(**options))[1] == "multi-draft"
            assert check_speculative(name, DrafterOptions(**options), "multi-draft")[1] == "multi-draft"
        assert check_speculative(name)[1] == ("multi-draft" if name == "tree" else "token")
        if name != "tree":
            assert check_speculative(name, None, "block")[1] == "block"


@pytest.mark.parametrize("verify", ["token", "block", "draw"])
@pytest.mark.parametrize("name", ["ngram", "early-exit", "quantized", "model:draft.gguf"])
def test_tree_options_with_a_chain_rule_are_refused_before_loading(name, verify):
    message = (rf"the {name} drafter with tree_widths=\(2, 2\) proposes token trees, which verify='{verify}' cannot "
               r"verify \(it verifies chains\): use a tree rule \(multi-draft, spectr\), or drop the tree options")
    with pytest.raises(ValueError, match=message):
        check_speculative(name, DrafterOptions(tree_widths=(2, 2)), verify)
    with pytest.raises(ValueError, match=message):
        SpeculativeGenerator.by_name(object(), name, SpeculativeConfig(verify=verify), tree_widths=(2, 2))


def test_confidence_with_tree_options_is_refused():
    with pytest.raises(ValueError, match=r"confidence=0.5 does not apply to tree drafts"):
        check_speculative("quantized", DrafterOptions(confidence=0.5, tree_nodes=8))
    with pytest.raises(ValueError, match=r"confidence=0.5 does not apply to tree drafts"):
        make_drafter("early-exit", object(), confidence=0.5, tree_widths=(2,))  # refused before the target is read
