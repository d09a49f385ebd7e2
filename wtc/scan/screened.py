"""scan(..., screen=K): screen every weight, scan exactly the screen's top K plus a uniform random
sample, and say how well the screen ranked them.

The random sample is what lets a user see what the screen misses: it is drawn uniformly from every
nonzero weight (the top K included), scanned exactly, and compared with the estimate (Spearman, and
which of its weights are as important as those the screen found but ranked outside its top K).
Stored side by side, each labelled:
    out/scan.sqlite            exact KLs of the chosen weights only (the ordinary scan store)
    out/screen/                the screen's resumable state; estimate.safetensors: every weight's *estimate*
    out/screened.csv           one row per exactly scanned weight: why chosen (top / random / top+random),
                               estimate, exact, the estimate's rank among all weights
    out/screen_vs_exact.png    estimate vs exact, log-log, top K and random sample apart
"""
from __future__ import annotations

import csv
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from wtc import arguments
from wtc.errors import ScanError
from wtc.scan.names import select
from wtc.scan.screening import ESTIMATOR, flat_ranking, screen

SPEARMAN_TRUSTED = 0.8      # the targets: below these the summary says the screen is not to be trusted
RECALL_TRUSTED = 0.9
RECALL_SAMPLE = 100         # random weights needed for the sample to have a top 1% (the recall figure)


@dataclass
class ScreenReport:
    """What scan(..., screen=K) found about its screen. estimate: every weight's estimated total KL
    (float64, not exact); top / random: bool masks of the weights scanned exactly for each reason;
    the figures compare the estimate with the exact KL on the random sample (an unbiased view of
    all weights) and on the top K."""
    estimator: str
    samples: int
    top_k: int
    random_sample: int
    weights: int
    spearman_random: float | None
    spearman_top: float | None
    recall_top1pct_in_screen_top5pct: float | None
    recall_top1pct_in_top_k: float | None
    missed_in_sample: int
    missed_estimate: float
    note: str
    estimate: dict[str, torch.Tensor] = field(repr=False, default_factory=dict)
    top: dict[str, torch.Tensor] = field(repr=False, default_factory=dict)
    random: dict[str, torch.Tensor] = field(repr=False, default_factory=dict)

    def summary(self) -> dict:
        """The figures and the note as JSON data (summary.json's "screen"), without the tensors."""
        return {k: v for k, v in asdict(self).items() if k not in ("estimate", "top", "random")}


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1, ties sharing their mean rank (scipy.stats.rankdata's "average", less one)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    _, group, counts = np.unique(x, return_inverse=True, return_counts=True)
    return (np.bincount(group, weights=ranks) / counts)[group]


def spearman(a, b) -> float | None:
    """Spearman's rank correlation of a and b (numpy only: the GPU image has no scipy); None when
    it is undefined (fewer than 3 values, or either side constant)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if len(a) < 3 or np.all(a == a[0]) or np.all(b == b[0]):
        return None
    return float(np.corrcoef(_ranks(a), _ranks(b))[0, 1])


def choose(estimate: dict[str, torch.Tensor], nonzero_weights: dict[str, torch.Tensor], k: int, n_random: int, seed: int):
    """Flat indices (into flat_ranking's order) of the k nonzero weights with the largest estimates
    and of n_random nonzero weights drawn uniformly; also the estimate's rank (0 = largest) of every
    weight (zero weights rank last)."""
    names, offsets, flat = flat_ranking(estimate)
    nonzero = np.flatnonzero(np.concatenate([nonzero_weights[n].cpu().flatten().numpy() for n in names]))
    order = nonzero[np.argsort(-flat[nonzero], kind="stable")]
    rank = np.full(len(flat), len(flat), np.int64)
    rank[order] = np.arange(len(order))
    top = order[:k]
    rng = np.random.default_rng([seed, 7])
    random = np.sort(rng.choice(nonzero, size=min(n_random, len(nonzero)), replace=False))
    return names, offsets, flat, rank, top, random, len(nonzero)


def _masks(names, offsets, picked, shapes) -> dict[str, torch.Tensor]:
    out = {}
    for i, n in enumerate(names):
        m = np.zeros(offsets[i + 1] - offsets[i], bool)
        sel = picked[(picked >= offsets[i]) & (picked < offsets[i + 1])] - offsets[i]
        m[sel] = True
        out[n] = torch.from_numpy(m).reshape(shapes[n])
    return out


def screened_scan(scan_fn, model, tokens, *, params, readout, screen_k, screen_random, screen_samples, seed,
                  out, progress, weights, positions, **scan_kwargs):
    """screen -> choose -> scan_fn (wtc.scan.engine.scan, passed in: no import cycle) -> report."""
    k = arguments.positive_int(screen_k, "screen", ScanError)
    if weights is not None:
        raise ScanError("screen= chooses the weights to scan exactly itself: pass weights= or screen=, not both")
    n_random = max(k, 200) if screen_random is None else int(arguments.positive_int(screen_random, "screen_random", ScanError))
    seed = arguments.seed(seed, error=ScanError)
    nonzero_total = sum(int((p.detach() != 0).sum()) for p in select(model, params).values())
    if k >= nonzero_total:     # a screen that picks every weight ranks nothing: said before it runs
        raise ScanError(f"screen={k} asks for at least every nonzero weight of the chosen parameters "
                        f"({nonzero_total}); scan them all exactly (no screen), or pass a K below {nonzero_total}")
    estimate = screen(model, tokens, params, readout, samples=screen_samples, seed=seed, positions=positions,
                      out=None if out is None else Path(out) / "screen", progress=progress)
    shapes = {n: tuple(e.shape) for n, e in estimate.items()}
    named = dict(model.named_parameters())
    nonzero = {n: named[n].detach() != 0 for n in estimate}
    names, offsets, flat, rank, top, random, n_nonzero = choose(estimate, nonzero, k, n_random, seed)
    top_m, random_m = _masks(names, offsets, top, shapes), _masks(names, offsets, random, shapes)
    chosen = {n: top_m[n] | random_m[n] for n in names}
    result = scan_fn(model, tokens, params=names, readout=readout, out=out, progress=progress, weights=chosen,
                     positions=positions, **scan_kwargs)
    exact = np.concatenate([result.total_kl[n].double().flatten().numpy() for n in names])
    report = _report(flat, exact, rank, top, random, n_nonzero, k, screen_samples)
    report.estimate, report.top, report.random = estimate, top_m, random_m
    if out is not None and _rank0():
        _write(Path(out), names, offsets, shapes, flat, exact, rank, top, random, estimate, report)
    result.screen = report
    return result


def _rank0() -> bool:
    return not (torch.distributed.is_available() and torch.distributed.is_initialized()) or torch.distributed.get_rank() == 0


def _report(flat, exact, rank, top, random, n_nonzero, k, samples) -> ScreenReport:
    sp_random = spearman(flat[random], exact[random])
    sp_top = spearman(flat[top], exact[top])
    # the random sample's own top 1% by exact KL: where the screen ranked it. Below RECALL_SAMPLE
    # weights the sample has no top 1% (its best weight is only about the model's top 1/R), and a
    # perfect screen would often rank it outside its top 5%: the recall is not measured then
    n_best = int(0.01 * len(random))
    best = random[np.argsort(-exact[random], kind="stable")[:n_best]]
    best = best[exact[best] > 0]
    five = max(1, int(math.ceil(0.05 * n_nonzero)))
    recall5 = float(np.mean(rank[best] < five)) if len(best) else None
    recall_k = float(np.mean(rank[best] < k)) if len(best) else None
    # random weights ranked outside the top K yet as important as the least important weight found in it
    floor = float(exact[top].min()) if len(top) else math.inf
    outside = random[rank[random] >= k]
    missed = int(np.sum(exact[outside] >= floor))
    missed_estimate = missed / max(1, len(random)) * n_nonzero
    trusted = (sp_random is not None and sp_random >= SPEARMAN_TRUSTED
               and (recall5 is None or recall5 >= RECALL_TRUSTED))
    if trusted:
        recall = "" if recall5 is not None else (f"; its recall of the top 1% is not measured (a random sample of "
                                                 f"at least {RECALL_SAMPLE} weights has a top 1%)")
        note = (f"on {len(random)} weights drawn at random and scanned exactly, the screen's ranking agrees with the "
                f"exact KL (Spearman {sp_random:.3f}){recall}; {missed} of them rank outside the screen's top {k} yet "
                f"move the output as much as a weight in it (about {missed_estimate:.0f} such weights in the model)")
    else:
        note = (f"the screen is NOT a reliable ranking here: on {len(random)} weights drawn at random and scanned exactly, "
                f"Spearman {'n/a' if sp_random is None else f'{sp_random:.3f}'} (trusted from {SPEARMAN_TRUSTED}), the "
                f"random sample's top 1% lies in the screen's top 5% for "
                f"{_recall_text(recall5, len(random))} (trusted from {RECALL_TRUSTED:.0%}); {missed} of them rank "
                f"outside the top {k} yet move the output as much as a weight in it (about {missed_estimate:.0f} in the "
                "model): scan more weights exactly (a larger K, or the whole scan)")
    return ScreenReport(ESTIMATOR, samples, k, len(random), n_nonzero, sp_random, sp_top, recall5, recall_k, missed,
                        missed_estimate, note)


def _recall_text(recall: float | None, sample: int) -> str:
    if recall is not None:
        return f"{recall:.0%}"
    return f"n/a (a sample of {sample} < {RECALL_SAMPLE} has no top 1%)" if sample < RECALL_SAMPLE else "n/a"


def _write(out: Path, names, offsets, shapes, flat, exact, rank, top, random, estimate, report) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({n: e.detach().double().cpu().contiguous() for n, e in estimate.items()}, str(out / "screen" / "estimate.safetensors"),
              metadata={"what": "ESTIMATED total KL of zeroing each weight (not exact; exact values: scan.sqlite)",
                        "estimator": report.estimator, "samples": str(report.samples)})
    why = {}
    for i in top:
        why[int(i)] = "top"
    for i in random:
        why[int(i)] = "top+random" if int(i) in why else "random"
    tmp = out / "screened.csv.tmp"
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["param", "index", "chosen", "estimate", "exact", "estimate_rank"])
        for i in sorted(why, key=lambda j: rank[j]):
            p = int(np.searchsorted(offsets, i, side="right") - 1)
            index = list(np.unravel_index(i - offsets[p], shapes[names[p]]))
            w.writerow([names[p], " ".join(str(int(x)) for x in index), why[i], repr(float(flat[i])),
                        repr(float(exact[i])), int(rank[i])])
    os.replace(tmp, out / "screened.csv")
    _plot(out / "screen_vs_exact.png", flat, exact, top, random, report)


def _plot(path: Path, flat, exact, top, random, report) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    tiny = 1e-12
    for idx, label, color in ((random, f"random sample ({len(random)})", "tab:blue"), (top, f"screen's top {len(top)}", "tab:red")):
        if len(idx):
            ax.scatter(np.maximum(flat[idx], tiny), np.maximum(exact[idx], tiny), s=6, alpha=0.6, label=label, color=color)
    both = np.concatenate([flat[top], exact[top], flat[random], exact[random]])
    both = both[both > tiny]
    if len(both):
        lo, hi = both.min(), both.max()
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="estimate = exact")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("estimated total KL (screen)")
    ax.set_ylabel("exact total KL (scan)")
    sp = "n/a" if report.spearman_random is None else f"{report.spearman_random:.3f}"
    ax.set_title(f"screen vs exact: Spearman {sp} on the random sample", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
