"""A linear probe: multinomial logistic regression from activations to a label, scored on held-out rows.

Features are standardised with the training rows' mean and spread, the fit is full-batch L-BFGS
in float64 on the mean cross-entropy plus l2 * |W|^2 (bias unpenalised), so a fit is a
deterministic function of its inputs (no learning rate, no epochs, no initialisation seed: the
loss is convex and starts from zero). The score is the argmax accuracy on the test rows, beside
the training accuracy (a probe that fits its training rows but not the test rows memorised) and
the chance level (the test share of the training rows' most frequent label).
"""
from __future__ import annotations

import numpy as np
import torch

from wtc.errors import StudyError


def _rows(x, y, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.as_tensor(np.asarray(x, dtype=np.float64))
    y = torch.as_tensor(np.asarray(y)).long()
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
        raise StudyError(f"linear probe {what}: need features (n, d) and labels (n,), got {tuple(x.shape)} and "
                         f"{tuple(y.shape)}")
    if len(x) == 0:
        raise StudyError(f"linear probe {what}: no rows")
    if not bool(torch.isfinite(x).all()):
        raise StudyError(f"linear probe {what}: features hold NaN or inf")
    return x, y


def fit(train_x, train_y, test_x, test_y, n_classes: int, l2: float = 1e-3, max_iter: int = 300) -> dict:
    """Fit on (train_x, train_y), score on (test_x, test_y); labels in [0, n_classes)."""
    xa, ya = _rows(train_x, train_y, "training rows")
    xb, yb = _rows(test_x, test_y, "test rows")
    if xa.shape[1] != xb.shape[1]:
        raise StudyError(f"linear probe: training rows have {xa.shape[1]} features, test rows {xb.shape[1]}")
    if not isinstance(n_classes, int) or n_classes < 2:
        raise StudyError(f"linear probe: n_classes must be an int >= 2, got {n_classes!r}")
    for y, what in ((ya, "training"), (yb, "test")):
        if int(y.min()) < 0 or int(y.max()) >= n_classes:
            raise StudyError(f"linear probe: {what} labels must lie in [0, {n_classes}), got "
                             f"{int(y.min())}..{int(y.max())}")
    if not (l2 >= 0 and np.isfinite(l2)):
        raise StudyError(f"linear probe: l2 must be a finite number >= 0, got {l2!r}")
    mean, std = xa.mean(0), xa.std(0)
    std = torch.where(std > 1e-12, std, torch.ones_like(std))          # a constant feature stays 0
    za, zb = (xa - mean) / std, (xb - mean) / std
    W = torch.zeros(za.shape[1], n_classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([W, b], max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(za @ W + b, ya) + l2 * (W * W).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        train_acc = float(((za @ W + b).argmax(1) == ya).double().mean())
        test_acc = float(((zb @ W + b).argmax(1) == yb).double().mean())
        loss = float(torch.nn.functional.cross_entropy(za @ W + b, ya))
    common = int(torch.bincount(ya, minlength=n_classes).argmax())
    return {"test_accuracy": test_acc, "train_accuracy": train_acc,
            "chance": float((yb == common).double().mean()), "train_loss": loss,
            "n_train": int(len(ya)), "n_test": int(len(yb)), "classes": n_classes, "l2": l2}


__all__ = ["fit"]
