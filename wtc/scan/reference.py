"""The naive per-weight scan: zero one weight, run the whole model, restore. The oracle for the
batched scan (tests) and its baseline (bench/ablation.py)."""
from __future__ import annotations

import torch

from wtc.scan.kl import kl_rows_reference


@torch.no_grad()
def naive_position_kl(model, tokens, name: str, readout=None, flat_indices=None) -> torch.Tensor:
    """(n_weights, N) float64 per-position KL(clean || zeroed) for weights of `name` (all by default)."""
    readout = readout or (lambda out: out)
    param = dict(model.named_parameters())[name]
    clean = readout(model(tokens))
    V = clean.shape[-1]
    logp = torch.log_softmax(clean.double(), -1).reshape(-1, V)
    flat = param.data.view(-1)
    indices = range(flat.numel()) if flat_indices is None else flat_indices
    rows = []
    for i in indices:
        keep = flat[i].clone()
        flat[i] = 0
        try:
            out = readout(model(tokens)).reshape(1, -1, V)
        finally:
            flat[i] = keep
        rows.append(kl_rows_reference(logp, out)[0])
    return torch.stack(rows)
