"""`metagen info`: describe a model — architecture, sizes, context, tokens, its experts (count,
top-k) if a mixture of experts, and how each kind of linear layer's weights are stored (e.g.
"int5g32 from Q5_0 ×12"); one JSON object with --json."""

from __future__ import annotations

import argparse
import json

from metagen.cli import common


def add_parser(commands) -> None:
    info = commands.add_parser("info", help="describe a model")
    common.add_model_options(info)
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from metagen.models.loading import weight_formats

    model = common.load_model(args)
    config = model.config
    facts = {
        "name": config.name,
        "source": model.source,
        "architecture": config.architecture,
        "parameters": config.num_parameters,
        "dtype": model.dtype,
        "kv_dtype": model.kv_dtype,
        "activations": model.activations,
        "context_length": config.max_position_embeddings,
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "attention_heads": config.num_attention_heads,
        "kv_heads": config.num_key_value_heads,
        "vocab_size": config.vocab_size,
        "tied_embeddings": config.tie_word_embeddings,
        "rope_theta": config.rope_theta,
        "eos_token_ids": sorted(model.eos_token_ids),
        "chat_template": model.tokenizer.chat_template is not None,
        "weights": weight_formats(model),
    }
    if config.num_experts:  # a mixture of experts: E experts of width I, k run per token (before "weights")
        weights = facts.pop("weights")
        facts.update(experts=config.num_experts, experts_per_token=config.num_experts_per_tok,
                     expert_intermediate_size=config.moe_intermediate_size, renormalized_top_k=config.norm_topk_prob,
                     shared_expert_intermediate_size=config.shared_expert_intermediate_size, weights=weights)
    if args.json:
        print(json.dumps(facts))
    else:
        _print_table(facts)
    return 0


def _print_table(facts: dict) -> None:
    """One "key  value" line per fact (integers with thousands separators), one per kind of linear."""
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        if key == "weights":  # one line per kind of linear: "int5g32 from Q5_0 ×12, ..."
            for name, counts in value.items():
                text = ", ".join(f"{label} ×{count}" for label, count in counts.items())
                print(f"{'weights.' + name:<{width}}  {text}")
            continue
        print(f"{key:<{width}}  {value:,}" if isinstance(value, int) and not isinstance(value, bool) else f"{key:<{width}}  {value}")
