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

In the graded corpus (wtc.tasks.agreement_graded) the headline's set also holds held-out sentences
whose subject is number-ambiguous ("the sheep near the keys"; modifier nouns of either number), in
the corpus's share of such subjects (`spearman_set` counts both parts): there the verb's number
is a graded prior that the models learn from the same statistics. `spearman_definite` is the
headline over the attractor sentences alone (the uniform corpus's set); `spearman_margin` is over
the headline's set; the `*_within_number` figures are over the attractor sentences (an ambiguous
subject has no number to split by); `spearman_ambiguous` is over the ambiguous sentences alone
(does the graded order agree, not only its place between the classes); `prior_spearman` (per
model) the Spearman of the coordinate with the nouns' P(plural verb), `prior_calibration` the mean
plural share of the verb forms' mass per ambiguous noun.

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


def compare(coords, margins, numbers, coords_na, margins_na, numbers_na, coords_amb=None, margins_amb=None,
            priors_amb=None) -> dict:
    """coords / margins: per model, (n,) arrays over the attractor sentences (numbers: their subject
    numbers, 0 / 1); *_na: the same over the sentences without attractors; *_amb: over the sentences
    with a number-ambiguous subject (graded corpus; priors_amb: each one's P(plural verb)), which
    join the attractor sentences in the headline's set. The figures of the module doc."""
    num, num_na = np.asarray(numbers), np.asarray(numbers_na)
    amb = coords_amb is not None and len(priors_amb) > 0
    head = [np.concatenate([a, b]) for a, b in zip(coords, coords_amb)] if amb else coords
    head_m = [np.concatenate([a, b]) for a, b in zip(margins, margins_amb)] if amb else margins
    mixed = [np.concatenate([a, b]) for a, b in zip(coords, coords_na)]
    num_mixed = np.concatenate([num, num_na])
    out = {}
    for key, whole, vals, n in (("spearman", head, coords, num), ("spearman_margin", head_m, margins, num),
                                ("spearman_mixed", mixed, mixed, num_mixed)):
        m, w = _matrix(whole, spearman), _matrix(vals, _within(n))
        out.update({key: m, f"min_{key}": _min_off(m), f"{key}_within_number": w,
                    f"min_{key}_within_number": _min_off(w)})
    d = _matrix(coords, spearman)
    out.update({"spearman_definite": d, "min_spearman_definite": _min_off(d)})
    out["coordinate_margin_r_within_number"] = [
        float(np.mean([np.corrcoef(z[num == k], mg[num == k])[0, 1] for k in (0, 1) if (num == k).sum() > 1]))
        for z, mg in zip(coords, margins)]
    out["spearman_set"] = {"attractor": int(len(num)), "ambiguous": int(len(priors_amb)) if amb else 0}
    if amb:
        pr = np.asarray(priors_amb, float)
        a = _matrix(coords_amb, spearman)
        out.update({"spearman_ambiguous": a, "min_spearman_ambiguous": _min_off(a),
                    "prior_spearman": [spearman(z, pr) for z in coords_amb],
                    "prior_margin_spearman": [spearman(mg, pr) for mg in margins_amb]})
        # per ambiguous noun (by its prior): the mean share of plural among the verb forms' mass
        levels = sorted(set(pr.tolist()))
        out["prior_calibration"] = {"p": levels, "models": [
            [float(np.mean(1 / (1 + np.exp(-np.asarray(mg)[pr == p])))) for p in levels] for mg in margins_amb]}
    return out
