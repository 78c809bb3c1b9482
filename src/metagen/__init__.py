"""metagen: inference-time algorithms for language models."""

__version__ = "0.1.0"
