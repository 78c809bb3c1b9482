"""Primitive generators (the sampling loop, beam search) and the sequence-level `Generator`
interface with its `Cost`, which meta-generation strategies build on."""

from metagen.decoding.cost import Cost
from metagen.decoding.generator import Generator, LocalGenerator, LocalModel
from metagen.decoding.beam_search import BeamSearchConfig, BeamSearchResult, Hypothesis, beam_search
from metagen.decoding.prompts import encode_prompt
from metagen.decoding.rows import Completion, Row, StopRules, TokenRecord, request_chain, token_records
from metagen.decoding.sample_loop import GenerationResult, StreamEvent, generate, generate_batch, stream

__all__ = [
    "Cost",
    "Generator",
    "LocalGenerator",
    "LocalModel",
    "BeamSearchConfig",
    "BeamSearchResult",
    "Completion",
    "GenerationResult",
    "Hypothesis",
    "Row",
    "StopRules",
    "StreamEvent",
    "TokenRecord",
    "beam_search",
    "encode_prompt",
    "generate",
    "generate_batch",
    "request_chain",
    "stream",
    "token_records",
]
