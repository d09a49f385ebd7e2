"""Comparing cores across seeds, and identifying the operators they carry."""
from __future__ import annotations

import math

import torch

from wtc.errors import AceError


def _bases(Q1, Q2) -> tuple[torch.Tensor, torch.Tensor]:
    """Two (D, r) float64 bases with orthonormal columns (a scaled or skewed one would give an
    overlap of 9 or angles of another subspace, so it is refused) in the same space."""
    out = []
    for name, Q in (("Q1", Q1), ("Q2", Q2)):
        if not torch.is_tensor(Q) or Q.ndim != 2:
            raise AceError(f"{name} must be a (D, r) tensor of orthonormal columns (e.g. core.Q), got "
                           f"{tuple(Q.shape) if torch.is_tensor(Q) else type(Q).__name__}")
        if Q.dtype.is_complex:
            raise AceError(f"{name} is complex ({Q.dtype}); a core basis is real")
        Q = Q.double()
        if not torch.isfinite(Q).all():
            raise AceError(f"{name} holds NaN or inf")
        err = float((Q.T @ Q - torch.eye(Q.shape[1], dtype=Q.dtype)).abs().max()) if Q.shape[1] else 0.0
        if err > 1e-4:
            raise AceError(f"{name}'s columns are not orthonormal (|Q^T Q - I| up to {err:.3g}); pass an "
                           "orthonormal basis such as core.Q, or torch.linalg.qr(Q).Q")
        out.append(Q)
    if out[0].shape[0] != out[1].shape[0]:
        raise AceError(f"Q1 and Q2 live in spaces of different dimension ({out[0].shape[0]} and {out[1].shape[0]})")
    return out[0], out[1]


def principal_angles(Q1: torch.Tensor, Q2: torch.Tensor) -> torch.Tensor:
    """Angles (radians, ascending) between span(Q1) and span(Q2); columns orthonormal."""
    Q1, Q2 = _bases(Q1, Q2)
    cos = torch.linalg.svdvals(Q1.T @ Q2).clamp(-1, 1)
    return torch.arccos(cos)


def projector_overlap(Q1: torch.Tensor, Q2: torch.Tensor) -> float:
    """||Q1^T Q2||_F^2 / sqrt(r1 r2): 1 for the same subspace, 0 for orthogonal ones."""
    Q1, Q2 = _bases(Q1, Q2)
    r1, r2 = Q1.shape[1], Q2.shape[1]
    if r1 == 0 or r2 == 0:
        return 0.0
    return float((Q1.double().T @ Q2.double()).pow(2).sum() / math.sqrt(r1 * r2))


def cca(X: torch.Tensor, Y: torch.Tensor, eps: float = 1e-10) -> torch.Tensor:
    """Canonical correlations (descending) between paired samples X (N, p) and Y (N, q)."""
    for name, A in (("X", X), ("Y", Y)):
        if not torch.is_tensor(A) or A.ndim != 2:
            raise AceError(f"CCA needs {name} as a (N, features) tensor, got "
                           f"{tuple(A.shape) if torch.is_tensor(A) else type(A).__name__}")
        if A.dtype.is_complex:
            raise AceError(f"CCA: {name} is complex ({A.dtype}); CCA here compares real activations")
        if not torch.isfinite(A).all():
            raise AceError(f"CCA: {name} holds NaN or inf")
    if X.shape[0] != Y.shape[0]:
        raise AceError(f"CCA needs paired samples, got {X.shape[0]} and {Y.shape[0]} rows")
    Xc, Yc = X.double() - X.double().mean(0), Y.double() - Y.double().mean(0)

    def basis(A):
        U, s, _ = torch.linalg.svd(A, full_matrices=False)
        return U[:, s > eps * max(float(s.max()), eps)] if s.numel() else U

    return torch.linalg.svdvals(basis(Xc).T @ basis(Yc)).clamp(0, 1)


def compare(cores, activations=None, top: int = 3) -> dict:
    """Pairwise overlap and principal angles of cores; with each core's activations on the same
    inputs (list of (N, D)), the mean of the top canonical correlations of their core coordinates."""
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise AceError(f"top must be a positive integer (canonical correlations averaged), got {top!r}")
    from wtc.ace.core import Core

    cores = list(cores)
    bad = [type(c).__name__ for c in cores if not isinstance(c, Core)]
    if bad:
        raise AceError(f"compare needs a list of Core (from extract_core), got {', '.join(bad)}")
    if len({c.basis.shape[0] for c in cores}) > 1:
        raise AceError(f"compare needs cores of one space; their dimensions are {[c.basis.shape[0] for c in cores]}")
    n = len(cores)
    overlap = [[projector_overlap(cores[i].Q, cores[j].Q) for j in range(n)] for i in range(n)]
    angles = [[principal_angles(cores[i].Q, cores[j].Q).tolist() for j in range(n)] for i in range(n)]
    out = {"overlap": overlap, "principal_angles": angles}
    if activations is not None:
        if len(activations) != n:
            raise AceError(f"{n} cores but {len(activations)} activation sets")
        Z = [c.project(h) for c, h in zip(cores, activations)]
        out["cca"] = [[float(cca(Z[i], Z[j])[:top].mean()) for j in range(n)] for i in range(n)]
    return out


def _spectrum(A: torch.Tensor, period: int | None) -> dict:
    ev = torch.linalg.eigvals(A)
    order = torch.argsort(ev.abs(), descending=True)
    ev = ev[order]
    out = {"eigenvalues": [[float(e.real), float(e.imag)] for e in ev],
           "radii": ev.abs().tolist(), "angles": ev.angle().tolist()}
    if period:
        out["frequency_bins"] = [int(round(abs(float(a)) * period / (2 * math.pi))) for a in ev.angle()]
    return out


def sequential_operator(Z: torch.Tensor, oracle: torch.Tensor | None = None) -> dict:
    """Least-squares A with z_{t+1} ~ z_t A over sequences Z (B, T, r); R^2 of the fit (and of the
    oracle's predictions when given, (B, T-1, r))."""
    if not torch.is_tensor(Z) or Z.ndim != 3:
        raise AceError(f"sequential_operator needs Z as a (B, T, r) tensor, got "
                       f"{tuple(Z.shape) if torch.is_tensor(Z) else type(Z).__name__}")
    if not torch.isfinite(Z).all():
        raise AceError("sequential_operator: Z holds NaN or inf")
    n, r = Z.shape[0] * (Z.shape[1] - 1), Z.shape[-1]
    if n <= r:
        raise AceError(f"sequential_operator: {n} transitions for {r} coordinates: with at most r transitions the "
                       "least-squares fit is exact for any Z and its R^2 says nothing; pass more sequences or positions")
    if oracle is not None and (not torch.is_tensor(oracle) or tuple(oracle.shape) != (Z.shape[0], Z.shape[1] - 1, r)):
        raise AceError(f"oracle must be (B, T-1, r) = {(Z.shape[0], Z.shape[1] - 1, r)}, got "
                       f"{tuple(oracle.shape) if torch.is_tensor(oracle) else type(oracle).__name__}")
    X = Z[:, :-1].reshape(-1, Z.shape[-1]).double()
    Y = Z[:, 1:].reshape(-1, Z.shape[-1]).double()
    A = torch.linalg.lstsq(X, Y).solution
    ss_tot = ((Y - Y.mean(0)) ** 2).sum()
    if float(ss_tot) == 0:
        raise AceError("sequential_operator: Z does not change from step to step (its R^2 is undefined)")
    out = {"A": A.tolist(), "r2": float(1 - ((X @ A - Y) ** 2).sum() / ss_tot), **_spectrum(A, None)}
    if oracle is not None:
        out["oracle_r2"] = float(1 - ((oracle.reshape(-1, Z.shape[-1]).double() - Y) ** 2).sum() / ss_tot)
    return out


def shift_operator(reps: torch.Tensor) -> dict:
    """A with reps[c] A ~ reps[c + 1 mod p] from class means reps (p, r): eigenvalues, radii,
    angles and frequency bins k = |angle| p / (2 pi).

    The fit means something only for r < p - 1: with r >= p - 1 coordinates (p centred class means
    span at most p - 1 dimensions) any class means are shifted exactly and every eigenvalue is a
    p-th root of unity, grokked or not (seen in the modular-addition study). Such input is an error.
    """
    if not torch.is_tensor(reps) or reps.ndim != 2:
        raise AceError(f"shift_operator needs class means reps as a (p, r) tensor, got "
                       f"{tuple(reps.shape) if torch.is_tensor(reps) else type(reps).__name__}")
    if not torch.isfinite(reps).all():
        raise AceError("shift_operator: reps hold NaN or inf")
    p, r = reps.shape
    if r >= p - 1:
        raise AceError(f"shift_operator: {r} coordinates for {p} classes: with r >= p - 1 the fit is exact "
                         f"for any class means and its eigenvalues say nothing; pass at most {p - 2} "
                         f"core coordinates (e.g. the top ones)")
    X = reps.double()
    Y = torch.roll(X, -1, 0)
    A = torch.linalg.lstsq(X, Y).solution
    return {"A": A.tolist(), "residual": float(((X @ A - Y) ** 2).sum() / (Y ** 2).sum().clamp_min(1e-30)),
            **_spectrum(A, p)}
