"""Tiny random process-reward checkpoints in the two formats, and their scores computed with
transformers directly (the reference the library must equal).

Both use the MiniLM WordPiece tokenizer (installed, nothing downloaded) with Math-Shepherd's
step tag "ки" and Qwen's separator "<extra_0>" added as single tokens, and a small chat template.
Models: 2 layers, hidden 32, weights ~ N(0, 0.2²) so the scores differ visibly between steps.
"""

from __future__ import annotations

import torch

CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=512)


def tokenizer():
    from transformers import AutoTokenizer

    from metagen.scoring.embeddings import minilm_dir

    tok = AutoTokenizer.from_pretrained(minilm_dir(), local_files_only=True)
    tok.add_tokens(["ки"])
    tok.add_special_tokens({"additional_special_tokens": ["<extra_0>"]})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _widen(model):
    torch.manual_seed(0)
    for name, parameter in model.named_parameters():
        if "norm" not in name.lower():
            parameter.data.normal_(0.0, 0.2)
    return model.eval()


def save_shepherd(path):
    """A causal LM (Llama) whose next-token logits after "ки" are read at "+" / "-"."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer()
    model = _widen(LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), **SIZES)))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


def save_qwen(path, num_labels=2):
    """A token classifier with two classes (bad, good), read at each "<extra_0>". A Llama body:
    transformers 5 loads any checkpoint of model_type qwen2 with its Qwen2 (byte-level BPE)
    tokenizer class whatever tokenizer_config.json says, which would read the WordPiece vocabulary
    letter by letter; the head and the reading of it are the same as Qwen2's."""
    from transformers import LlamaConfig, LlamaForTokenClassification

    tok = tokenizer()
    model = _widen(LlamaForTokenClassification(LlamaConfig(vocab_size=len(tok), num_labels=num_labels, **SIZES)))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


def shepherd_reference(model, tok, question, steps):
    """Math-Shepherd's model-card recipe: P("+") against P("-") after each "ки", one unpadded forward."""
    text = question + " " + "\n".join(step.strip() + " ки" for step in steps)
    ids = tok.encode(text)
    good, bad = tok.encode("+ -", add_special_tokens=False)
    tag = tok.convert_tokens_to_ids("ки")
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]  # (T, V)
    positions = [t for t, token in enumerate(ids) if token == tag]
    return logits[positions][:, [good, bad]].softmax(-1)[:, 0].tolist(), len(ids)


def qwen_conversation(question, steps):
    return [{"role": "system", "content": "Please reason step by step, and put your final answer within \\boxed{}."},
            {"role": "user", "content": question},
            {"role": "assistant", "content": "".join(step.strip() + "<extra_0>" for step in steps)}]


def qwen_ids(tok, messages):
    text = tok.apply_chat_template(messages, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def qwen_rows(model, tok, ids):
    """softmax of the two class logits at each "<extra_0>" of `ids`: [[p_bad, p_good], ...]."""
    separator = tok.convert_tokens_to_ids("<extra_0>")
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]  # (T, 2)
    positions = [t for t, token in enumerate(ids) if token == separator]
    return logits[positions].softmax(-1).tolist()


def qwen_reference(model, tok, question, steps):
    """Qwen2.5-Math-PRM's model-card recipe: P(class 1) at each separator, one unpadded forward."""
    ids = qwen_ids(tok, qwen_conversation(question, steps))
    return [row[1] for row in qwen_rows(model, tok, ids)], len(ids)
