"""Finishing fits of a frozen Discrete Transformer: the exact least-squares head and the L-BFGS
polish of the continuous parts with the pointers pinned (used by wtc.dt.attempt)."""
from __future__ import annotations

import time

import torch

from wtc.dt.model import DiscreteTransformer
from wtc.dt.selection import EVAL

# A replica whose mean squared error (normalised target units) is below this already fits the
# polish batch to float32 noise (rms 1e-6 of the target's std); see polish().
EXACT_FIT = 1e-12
POLISH_CHUNK = 20    # L-BFGS iterations between looks at the clock when the polish has a deadline


def masked_mse(pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """pred (R, B, T, O), target/valid (B, T, O) -> per-replica mean squared error (R,)."""
    err = (pred - target).square() * valid
    return err.sum(dim=(1, 2, 3)) / valid.sum().clamp(min=1)


@torch.no_grad()
def least_squares_head(feats: torch.Tensor, y: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The exact linear head of a stream: feats (R, B, T, V) at the real positions, targets y and
    valid (B, T, O) -> (W (R, V, O), b (R, O), each replica's sum of squared errors (R,)), float64,
    a tiny ridge for dead variables."""
    feats = feats.double()
    R, V, O = feats.shape[0], feats.shape[-1], y.shape[-1]
    W = torch.zeros(R, V, O, dtype=torch.float64, device=feats.device)
    b = torch.zeros(R, O, dtype=torch.float64, device=feats.device)
    sse = torch.zeros(R, dtype=torch.float64, device=feats.device)
    ridge = 1e-9 * torch.eye(V + 1, dtype=torch.float64, device=feats.device)
    for o in range(O):
        keep = valid[..., o].bool().reshape(-1)
        target = y[..., o].reshape(-1)[keep].double()
        for r in range(R):
            A = torch.cat([feats[r].reshape(-1, V)[keep],
                           torch.ones(int(keep.sum()), 1, dtype=torch.float64, device=feats.device)], 1)
            w = torch.linalg.solve(A.T @ A + ridge, A.T @ target)
            W[r, :, o], b[r, o] = w[:V], w[V]
            sse[r] += (A @ w - target).square().sum()
    return W, b, sse


@torch.no_grad()
def refit_head(model: DiscreteTransformer, x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Least-squares output head on the frozen stream (least_squares_head). Returns each replica's
    mean squared error with the new head (R,), as masked_mse counts it."""
    W, b, sse = least_squares_head(model.final_stream(x)[:, :, model.P:], y, valid)
    model.W_out.copy_(W.float())
    model.b_out.copy_(b.float())
    return (sse / valid.sum().clamp(min=1)).float()


def polish(model: DiscreteTransformer, x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor,
           iters: int, until: float | None = None) -> torch.Tensor:
    """Full-batch L-BFGS on the sub-MLPs and head of the frozen model, pointers pinned.

    Replicas are independent, so the objective is the sum of each replica's loss relative to its
    starting loss (one replica's scale cannot dominate the shared line search). A replica that
    ends worse than it started (including after re-evaluating the pointers) is restored.
    Returns each replica's loss after / before (R,), 1 for a restored one.

    Skipped when some replica already fits to float32 noise (EXACT_FIT): the population then has
    its answer, and the 200 iterations went to rounding noise of the exact ones and to the others,
    which are read only if the exact one fails (xor_pair rung 0: 8.3 s CPU of a 36 s attempt, every
    replica at 1e-15 after the head refit; parity_last2: 6 of 8).

    until (time.time() seconds): the iterations run in chunks of POLISH_CHUNK and stop after the
    chunk that passes it (L-BFGS keeps its curvature history across chunks).
    """
    params = [p for b in model.blocks if b.mlp is not None
              for p in b.mlp.parameters_of_map()] + [model.W_out, model.b_out]
    before = [p.detach().clone() for p in params]
    with torch.no_grad():
        start = masked_mse(model(x, EVAL)[0], y, valid)
    if bool((start < EXACT_FIT).any()):
        return torch.ones_like(start)
    scale = start.clamp(min=1e-12)
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=iters, history_size=20,
                            tolerance_grad=1e-12, tolerance_change=1e-14, line_search_fn="strong_wolfe")
    with model.pinned_pointers(x):
        def closure():
            opt.zero_grad()
            loss = (masked_mse(model(x, EVAL)[0], y, valid) / scale).sum()
            loss.backward()
            return loss

        if until is None:
            opt.step(closure)
        else:
            done = 0
            while done < iters and time.time() < until:
                chunk = min(POLISH_CHUNK, iters - done)
                for group in opt.param_groups:
                    group["max_iter"], group["max_eval"] = chunk, chunk * 5 // 4
                opt.step(closure)
                done += chunk
    with torch.no_grad():
        end = masked_mse(model(x, EVAL)[0], y, valid)
        worse = ~(end <= start)
        for p, b in zip(params, before):
            p[worse] = b[worse]
    return torch.where(worse, torch.ones_like(end), end / scale)
