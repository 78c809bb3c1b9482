"""Llama (1/2/3.x, SmolLM2) and Mistral: the base family.

Pre-norm RMSNorm, SwiGLU MLP, RoPE (llama3 / linear scaling), grouped-query attention, no
biases. llama.cpp stores their GGUF Q/K rows already interleaved. Mistral's sliding window
applies to every layer (`ModelConfig.layer_window`), so its cache releases the slots that left
every row's window.
"""

from metagen.models.families.family import Family

LLAMA = Family("llama", gguf_rotate_half=False)
MISTRAL = Family("mistral", gguf_rotate_half=False)
FAMILIES = (LLAMA, MISTRAL)
