"""Reward-model scorer on a tiny random Llama sequence classifier: scores equal unbatched
transformers forwards (so padding and batching change nothing), text formats, and cost."""

import pytest
import torch

from metagen.decoding.result import Completion

PROMPT = "What is the capital of France?"
RESPONSES = ["It is Paris, the largest city of France.", "Paris.", "Berlin, I think, or maybe Rome."]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def save_checkpoint(path, *, num_labels=1, chat_template=None, padding_side="right", bert=False):
    """A 2-layer random classifier with the MiniLM WordPiece tokenizer (pad id 0): Llama (RoPE,
    last-token head) or BERT (absolute positions, [CLS] head)."""
    from transformers import (AutoTokenizer, BertConfig, BertForSequenceClassification, LlamaConfig,
                              LlamaForSequenceClassification)

    from metagen.scoring.embeddings import minilm_dir

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir(), local_files_only=True)
    tokenizer.chat_template = chat_template
    tokenizer.padding_side = padding_side
    sizes = dict(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=128, num_labels=num_labels,
                 pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    if bert:
        model = BertForSequenceClassification(BertConfig(**sizes)).eval()
    else:
        model = LlamaForSequenceClassification(LlamaConfig(num_key_value_heads=2, **sizes)).eval()
    for name, parameter in model.named_parameters():  # random init is near zero; widen it so scores differ
        if "norm" not in name.lower():
            parameter.data.normal_(0.0, 0.2)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer


def direct_scores(model, tokenizer, texts, add_special_tokens):
    """One unpadded forward per text."""
    values = []
    for text in texts:
        batch = tokenizer(text, add_special_tokens=add_special_tokens, return_tensors="pt")
        with torch.no_grad():
            values.append(model(**batch).logits[0])
    return values


@pytest.mark.parametrize("bert", [False, True], ids=["llama", "bert"])
def test_scores_equal_unbatched_forwards_whatever_the_padding_side(tmp_path, bert):
    """Checkpoints saved to pad on the left: with absolute positions (BERT) left padding would
    shift every position, so the scorer must pad on the right."""
    from metagen.scoring.reward_model import RewardModelScorer

    model, tokenizer = save_checkpoint(tmp_path, padding_side="left", bert=bert)
    expected = [v[0].item() for v in direct_scores(model, tokenizer, [f"{PROMPT}\n\n{r}" for r in RESPONSES], True)]
    assert len({len(tokenizer(f"{PROMPT}\n\n{r}")["input_ids"]) for r in RESPONSES}) == 3  # batches need padding
    scorer = RewardModelScorer(str(tmp_path), batch_size=3)
    scores = scorer(PROMPT, [Completion(r) for r in RESPONSES])
    assert scores.values == pytest.approx(expected, abs=1e-5)
    assert max(expected) - min(expected) > 1e-2  # the check can see a wrong row
    one_by_one = RewardModelScorer(str(tmp_path), batch_size=1)(PROMPT, [Completion(r) for r in RESPONSES])
    assert one_by_one.values == pytest.approx(expected, abs=1e-5)

    tokens = sum(len(tokenizer(f"{PROMPT}\n\n{r}")["input_ids"]) for r in RESPONSES)
    two = RewardModelScorer(str(tmp_path), batch_size=2)(PROMPT, [Completion(r) for r in RESPONSES])
    assert two.values == pytest.approx(expected, abs=1e-5)
    assert two.cost.model_calls == 2 and two.cost.prompt_tokens_computed == tokens
    assert two.cost.flops == 2.0 * model.num_parameters(exclude_embeddings=True) * tokens


def test_chat_template_two_labels_and_user_template(tmp_path):
    from metagen.scoring.reward_model import RewardModelScorer

    model, tokenizer = save_checkpoint(tmp_path, num_labels=2, chat_template=CHAT_TEMPLATE)
    texts = [f"user: {PROMPT}\nassistant: {r}\n" for r in RESPONSES]
    assert tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "x"}],
                                         tokenize=False) == f"user: {PROMPT}\nassistant: x\n"
    logits = direct_scores(model, tokenizer, texts, add_special_tokens=False)
    scores = RewardModelScorer(str(tmp_path), batch_size=2)(PROMPT, [Completion(r) for r in RESPONSES])
    assert scores.values == pytest.approx([(v[1] - v[0]).item() for v in logits], abs=1e-5)  # log-odds of label 1

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    chat = RewardModelScorer(str(tmp_path))(messages, [Completion("Paris.")])
    [logit] = direct_scores(model, tokenizer, [f"system: Be brief.\nuser: {PROMPT}\nassistant: Paris.\n"], False)
    assert chat.values == pytest.approx([(logit[1] - logit[0]).item()], abs=1e-5)

    templated = RewardModelScorer(str(tmp_path), template="Q: {prompt} A: {response}")(PROMPT, [Completion("Paris.")])
    [logit] = direct_scores(model, tokenizer, [f"Q: {PROMPT} A: Paris."], True)
    assert templated.values == pytest.approx([(logit[1] - logit[0]).item()], abs=1e-5)


def test_bad_arguments(tmp_path):
    from metagen.scoring.reward_model import RewardModelScorer

    with pytest.raises(ValueError, match="batch_size=0"):
        RewardModelScorer(str(tmp_path), batch_size=0)
    save_checkpoint(tmp_path, num_labels=3)
    with pytest.raises(ValueError, match="num_labels=3"):
        RewardModelScorer(str(tmp_path))
