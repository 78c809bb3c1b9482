"""Speculative decoding: lossless verification rules as pure tensor functions.

`token_verify` (Leviathan et al. / Chen et al. 2023), `block_verify` (Sun et al. 2024),
`greedy_verify` (temperature 0) and `multi_draft_verify` (recursive rejection sampling,
Jeon et al. 2024). Each returns the number of accepted draft tokens and the next token.
"""

from metagen.speculative.block_verify import block_verify
from metagen.speculative.multi_draft import multi_draft_verify
from metagen.speculative.token_verify import token_verify
from metagen.speculative.verify import greedy_verify

__all__ = ["block_verify", "greedy_verify", "multi_draft_verify", "token_verify"]
