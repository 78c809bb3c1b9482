"""Math-Shepherd and Qwen2.5-Math-PRM style checkpoints (tiny, random, built here) as process
rewards: per-step scores equal the model-card recipes run with transformers directly, batched
or not; cost; the value of tree searches by name; errors naming the path."""

import pytest
import torch

from metagen.decoding import LocalGenerator
from metagen.sampling import SamplingParams
from metagen.strategies.registry import StrategyOptions, get_strategy, value_is_head
from tests.decoding.toy_model import ToyModel
from tests.scoring import prm_checkpoints as checkpoints

pytest.importorskip("transformers")

QUESTION = "Tom has 3 apples and buys 4 more. How many?"
SOLUTIONS = [
    ["3 + 4 = 7\n", "He has 7 apples.\n", "The answer is 7"],
    ["3 + 4 = 8\n", "The answer is 8"],
    ["Apples are red.\n", "So 3 x 4 = 12 ки<extra_0>\n", "Then 12 - 4 = 8\n", "The answer is 8"],  # markers
]


@pytest.fixture(scope="module")
def shepherd(tmp_path_factory):
    path = tmp_path_factory.mktemp("shepherd")
    model, tok = checkpoints.save_shepherd(path)
    return str(path), model, tok


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen")
    model, tok = checkpoints.save_qwen(path)
    return str(path), model, tok


@pytest.mark.parametrize("kind", ["shepherd", "qwen"])
@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_step_scores_equal_the_model_card_recipe(kind, batch_size, shepherd, qwen, one_thread):
    from metagen.scoring.step_prm import CheckpointPRM

    path, model, tok = shepherd if kind == "shepherd" else qwen
    reference = checkpoints.shepherd_reference if kind == "shepherd" else checkpoints.qwen_reference
    # the marker a step wrote is dropped from the PRM's input (it would forge a step end)
    marker = "ки" if kind == "shepherd" else "<extra_0>"
    cleaned = [[step.replace(marker, "") for step in steps] for steps in SOLUTIONS]
    expected = [reference(model, tok, QUESTION, steps) for steps in cleaned]
    assert len({length for _, length in expected}) == 3  # batches need padding

    prm = CheckpointPRM(path, batch_size=batch_size)
    assert prm.kind == kind  # read from config.json's architectures
    scored = prm.score_many(QUESTION, SOLUTIONS)
    for values, (scores, _), steps in zip(scored, expected, SOLUTIONS):
        assert len(values.values) == len(steps)
        assert values.values == pytest.approx(scores, abs=1e-5)
        assert all(0.0 < v < 1.0 for v in values.values)
    flat = [v for scores, _ in expected for v in scores]
    assert max(flat) - min(flat) > 0.05  # the comparison can see a wrong position

    tokens = sum(length for _, length in expected)
    parameters = model.num_parameters(exclude_embeddings=True)
    total = sum((v.cost for v in scored), start=type(scored[0].cost)())
    assert total.model_calls == -(-3 // batch_size)
    assert total.prompt_tokens_computed == tokens
    assert total.flops == total.scorer_flops == 2.0 * parameters * tokens
    assert prm.score_steps(QUESTION, SOLUTIONS[1]).values == pytest.approx(expected[1][0], abs=1e-5)


def test_explicit_kind_and_configurable_tokens(shepherd, one_thread):
    """prm-shepherd with other good / bad tokens reads those tokens' logits."""
    from metagen.scoring.step_prm import CheckpointPRM

    path, model, tok = shepherd
    prm = CheckpointPRM(path, "shepherd", good_token="yes", bad_token="no")
    steps = SOLUTIONS[0]
    ids = tok.encode(QUESTION + " " + "\n".join(s.strip() + " ки" for s in steps))
    good, bad = tok.convert_tokens_to_ids(["yes", "no"])
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    tag = tok.convert_tokens_to_ids("ки")
    expected = logits[[t for t, i in enumerate(ids) if i == tag]][:, [good, bad]].softmax(-1)[:, 0]
    assert prm.score_steps(QUESTION, steps).values == pytest.approx(expected.tolist(), abs=1e-5)


@pytest.mark.parametrize("name", ["best_of_n_value", "step_beam"])
@pytest.mark.parametrize("kind", ["shepherd", "qwen"])
def test_a_tree_search_runs_with_the_prm_as_its_value(name, kind, shepherd, qwen, one_thread):
    path, model, tok = shepherd if kind == "shepherd" else qwen
    reference = checkpoints.shepherd_reference if kind == "shepherd" else checkpoints.qwen_reference
    options = StrategyOptions(value=f"prm:{path}", step_delimiter="b")
    assert not value_is_head(options)
    toy = ToyModel()
    result = get_strategy(name).run(LocalGenerator(toy), "a", 4, SamplingParams(temperature=1.0, max_tokens=6),
                                    options, torch.Generator().manual_seed(0))
    assert result.completions and result.chosen in result.completions
    from metagen.scoring.process_reward import split_steps

    for candidate in result.completions:  # each score: min over the candidate's steps, by hand
        steps = split_steps(candidate.text, "b") or [candidate.text]
        scores, _ = reference(model, tok, "a", steps)
        assert candidate.score == pytest.approx(min(scores), abs=1e-5)
    parameters = model.num_parameters(exclude_embeddings=True)
    assert result.cost.scorer_flops > 0
    assert (result.cost.scorer_flops / (2.0 * parameters)) == pytest.approx(
        round(result.cost.scorer_flops / (2.0 * parameters)))  # whole tokens through the PRM
    assert result.cost.flops > result.cost.scorer_flops  # the generator's own FLOPs come on top


def test_bad_paths_and_checkpoints_are_named(tmp_path, shepherd, one_thread):
    from metagen.scoring.step_prm import CheckpointPRM, prm_value

    missing = tmp_path / "nowhere"
    with pytest.raises(ValueError, match=f"value=prm:{missing}: '{missing}' is not a directory"):
        prm_value(f"prm:{missing}", None, QUESTION, "\n")
    with pytest.raises(ValueError, match="no config.json"):
        prm_value(f"prm-qwen:{tmp_path}", None, QUESTION, "\n")
    options = StrategyOptions(value=f"prm:{missing}", step_delimiter="b")
    with pytest.raises(ValueError, match="is not a directory"):
        get_strategy("step_beam").run(LocalGenerator(ToyModel()), "a", 4, SamplingParams(max_tokens=4), options,
                                      torch.Generator().manual_seed(0))

    from transformers import BertConfig, BertModel

    BertModel(BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=8)).save_pretrained(tmp_path / "bert")
    with pytest.raises(ValueError, match=r"architectures \['BertModel'\] is neither"):
        CheckpointPRM(str(tmp_path / "bert"))

    path, _, _ = shepherd  # a causal LM read as a token classifier: its head would be random
    with pytest.raises(ValueError, match="lacks weights"):
        CheckpointPRM(path, "qwen")

    checkpoints.save_qwen(tmp_path / "three", num_labels=3)
    with pytest.raises(ValueError, match="num_labels=3"):
        CheckpointPRM(str(tmp_path / "three"))
    with pytest.raises(ValueError, match=r"its vocabulary has no token '\+\+' \(good_token\)"):
        CheckpointPRM(path, good_token="++", bad_token="-")


def _plain(path, head):
    """A tiny Llama with `head` ("causal" or "token") and the plain MiniLM tokenizer: no "ки", no "<extra_0>"."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification

    from metagen.scoring.embeddings import minilm_dir

    tok = AutoTokenizer.from_pretrained(minilm_dir(), local_files_only=True)
    tok.chat_template = checkpoints.CHAT_TEMPLATE
    model_class = LlamaForCausalLM if head == "causal" else LlamaForTokenClassification
    extra = {} if head == "causal" else {"num_labels": 2}
    model_class(LlamaConfig(vocab_size=len(tok), **checkpoints.SIZES, **extra)).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_a_causal_lm_without_the_shepherd_tokens_is_refused_naming_them(tmp_path, one_thread):
    """Any causal LM would otherwise be read as a Math-Shepherd PRM, scoring noise at a tag that is
    no token of its vocabulary (here "ки" splits into pieces)."""
    from metagen.scoring.step_prm import CheckpointPRM

    path = _plain(tmp_path / "lm", "causal")
    with pytest.raises(ValueError, match=r"value=prm:.*lm: its vocabulary has no token 'ки' \(step_tag\).*Math-Shepherd"):
        CheckpointPRM(path)
    with pytest.raises(ValueError, match=r"no token 'ки' \(bad_token\)"):
        CheckpointPRM(path, "shepherd", step_tag="+", good_token="ok", bad_token="ки")


def test_a_token_classifier_without_qwens_separator_is_named_unsupported(tmp_path, one_thread):
    """A TRL-style token-classification PRM (PRMTrainer: steps separated by a newline, no
    "<extra_0>") is not a format metagen reads: the error says so, rather than blaming a token."""
    from metagen.scoring.step_prm import CheckpointPRM

    path = _plain(tmp_path / "trl", "token")
    with pytest.raises(ValueError, match=r"not supported.*TRL"):
        CheckpointPRM(path)
