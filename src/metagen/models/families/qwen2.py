"""Qwen2 / Qwen2.5: the Llama layer with q/k/v biases; GGUF Q/K rows in rotate-half order.

config.json writes a `sliding_window` the model uses only when `use_sliding_window` is true, and
then only from layer `max_window_layers` on: the first layers stay global (as in Qwen3 and the
Qwen mixtures of experts).
"""

from metagen.models.families.family import Family

QWEN2 = Family("qwen2", attention_bias=True, hf_leading_global_layers="max_window_layers")
FAMILIES = (QWEN2,)
