"""Cross-model comparison of the agreement axis (wtc.studies.agreement).

The headline (`spearman`, the issue's and the paper's figure): Spearman correlation between two
models' 1-D core coordinates over the same held-out attractor sentences (each coordinate's sign
fixed so that it grows with its model's margin). Beside it, what explains its size:

- `spearman_within_number`: the same within each subject number (mean of singular and plural).
  For two equal classes that both coordinates separate perfectly, the split alone gives 0.75
  whatever the order inside the classes, and roughly 0.75 + 0.25 x the within-class agreement;
- `spearman_margin` / `spearman_margin_within_number`: the same for the models' clean margins
  (log P(plural verbs) - log P(singular verbs)), i.e. how far the models' *behaviour* orders the
  sentences alike; a coordinate that tracks its model's margin cannot agree across models much
  beyond how far the margins do;
- `coordinate_margin_r_within_number`: per model, the within-number Pearson r of the coordinate and
  the model's own margin (how faithfully the axis carries the graded margin, not only its sign);
- `spearman_mixed` (+ within number): over the attractor sentences and as many held-out sentences
  without attractors (the composition of the set the core is fitted on).

Ranks are average ranks (ties share their mean rank), the textbook Spearman.
"""
from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


def spearman(a, b) -> float:
    """Spearman's rho: the Pearson correlation of the average ranks."""
    ra, rb = rankdata(np.asarray(a, float)), rankdata(np.asarray(b, float))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _matrix(vals, fn) -> list[list[float]]:
    return [[fn(a, b) for b in vals] for a in vals]


def _within(num: np.ndarray):
    def fn(a, b):
        return float(np.mean([spearman(a[num == k], b[num == k]) for k in (0, 1) if (num == k).sum() > 1]))
    return fn


def _min_off(m) -> float | None:
    off = [m[i][j] for i in range(len(m)) for j in range(len(m)) if i != j]
    return min(off) if off else None


def compare(coords, margins, numbers, coords_na, margins_na, numbers_na) -> dict:
    """coords / margins: per model, (n,) arrays over the attractor sentences (numbers: their subject
    numbers, 0 / 1); *_na: the same over the sentences without attractors. The figures of the module doc."""
    num, num_na = np.asarray(numbers), np.asarray(numbers_na)
    mixed = [np.concatenate([a, b]) for a, b in zip(coords, coords_na)]
    num_mixed = np.concatenate([num, num_na])
    out = {}
    for key, vals, n in (("spearman", coords, num), ("spearman_margin", margins, num),
                         ("spearman_mixed", mixed, num_mixed)):
        m, w = _matrix(vals, spearman), _matrix(vals, _within(n))
        out.update({key: m, f"min_{key}": _min_off(m), f"{key}_within_number": w,
                    f"min_{key}_within_number": _min_off(w)})
    out["coordinate_margin_r_within_number"] = [
        float(np.mean([np.corrcoef(z[num == k], mg[num == k])[0, 1] for k in (0, 1) if (num == k).sum() > 1]))
        for z, mg in zip(coords, margins)]
    return out
