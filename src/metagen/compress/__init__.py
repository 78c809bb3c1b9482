"""Model compression: fewer bytes per parameter.

One algorithm per module, each a pure function on one layer's weight `(N, K)` (and, for the
second-order methods, its layer-wise Hessian `H = 2XXᵀ (K, K)`):

- `quantize`: uniform grids per group with the clipping range chosen by least squared error
  (clip, then equally spaced bins), round-to-nearest (RTN);
- `magnitude`: magnitude pruning, unstructured and N:M;
- `obc`: optimal brain surgeon / optimal brain compression, pruning and quantization, by their
  defining loops (Hassibi et al. 1993; Frantar & Alistarh 2022);
- `gptq`: GPTQ's fixed-order sweep with lazy blocks and the Cholesky factor of H⁻¹;
- `sparsegpt`: SparseGPT's per-block mask selection on the same sweep (sparse + quantized too);
- `hessian`: the accumulated Hessian, dampening, the layer error ‖WX − ŴX‖²;
- `calibrate` (imports the model floor): a whole model compressed layer by layer through its
  own forward, saved and reloaded with its recipe.

Importing this package imports torch only.
"""

from metagen.compress.gptq import SweepResult, gptq
from metagen.compress.hessian import HessianAccumulator, layer_error
from metagen.compress.magnitude import magnitude_mask, n_m_mask, prune_magnitude
from metagen.compress.obc import obc_prune, obc_quantize
from metagen.compress.quantize import Grid, clip_quantize, fit_grid, quantize_rtn
from metagen.compress.sparsegpt import sparsegpt

__all__ = [
    "Grid", "HessianAccumulator", "SweepResult", "clip_quantize", "fit_grid", "gptq", "layer_error",
    "magnitude_mask", "n_m_mask", "obc_prune", "obc_quantize", "prune_magnitude", "quantize_rtn", "sparsegpt",
]
