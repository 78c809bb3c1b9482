"""Qwen2 / Qwen2.5: the Llama layer with q/k/v biases; GGUF Q/K rows in rotate-half order."""

from metagen.models.families import Family

QWEN2 = Family("qwen2", attention_bias=True)
FAMILIES = (QWEN2,)
