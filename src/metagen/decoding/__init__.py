"""Primitive generators: the sampling loop and beam search."""

from metagen.decoding.beam_search import BeamSearchConfig, BeamSearchResult, Hypothesis, beam_search
from metagen.decoding.prompts import encode_prompt
from metagen.decoding.sample_loop import Completion, GenerationResult, StreamEvent, generate, generate_batch, stream

__all__ = [
    "BeamSearchConfig",
    "BeamSearchResult",
    "Completion",
    "GenerationResult",
    "Hypothesis",
    "StreamEvent",
    "beam_search",
    "encode_prompt",
    "generate",
    "generate_batch",
    "stream",
]
