"""Report, plot and control verdict of the sparse-vs-dense study (wtc.studies.sparse_dense)."""
from __future__ import annotations

from pathlib import Path

NEAR_ZERO = 0.05          # a control's fraction at or below this counts as "near zero"
ORDER = (("dense", ("dense",)), ("sparse", ("sparse",)), ("random", ("controls", "random")),
         ("shuffled", ("controls", "shuffled")))


def models(s: dict) -> list[tuple[str, dict]]:
    out = []
    for name, path in ORDER:
        v = s
        for p in path:
            v = v[p]
        out.append((name, v))
    return out


def verdict(s: dict) -> dict:
    """Per definition and figure (interpretable, robust): whether both controls are near zero
    (<= NEAR_ZERO) and whether each trained model is above both controls beyond their 95%
    intervals (its lower bound above the controls' upper bounds)."""
    m = dict(models(s))
    out = {}
    for d in s["definitions"]:
        row = {}
        for fig in ("interpretable", "robust"):
            get = {k: m[k]["definitions"][d["name"]] for k in m}
            ctrl_hi = max((get[c][f"{fig}_ci"] or (0.0, 0.0))[1] for c in ("random", "shuffled"))
            row[fig] = {"controls_near_zero": all((get[c][f"{fig}_fraction"] or 0.0) <= NEAR_ZERO
                                                  for c in ("random", "shuffled")),
                        **{f"{k}_above_controls": bool(get[k][f"{fig}_ci"] and get[k][f"{fig}_ci"][0] > ctrl_hi)
                           for k in ("sparse", "dense")}}
        out[d["name"]] = row
    return out


def _f(v, ci=None) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def markdown(s: dict) -> str:
    c = s["config"]
    ms = models(s)
    lines = [f"# Sparse vs dense, with controls ({c['steps']} steps, batch {c['batch']}, target density "
             f"{c['density']}, {c['sample']} weights each, {s['seconds']} s)", "",
             f"Corpus: {s['corpus']['files']} stdlib files, {s['corpus']['train_bytes']} train / "
             f"{s['corpus']['heldout_bytes']} held-out bytes (sha256 {s['corpus']['sha256'][:12]}). Controls: `random` "
             "is the dense architecture untrained; `shuffled` is it trained like the dense model on the same bytes "
             "with their order shuffled within every sequence of ctx + 1 bytes. Every fraction is of the weights "
             f"scored (nonzero effect on the search set), with its {s['ci']} in brackets.", "",
             "| model | density | held-out loss (nats/byte) | scored | interpretable | robust | reliability | mean score |",
             "|---|---|---|---|---|---|---|---|"]
    for k, r in ms:
        lines.append(f"| {k} | {r['density']:.4f} | {r['heldout_loss']:.3f} | {r['weights_scored']} | "
                     f"{_f(r['interpretable_fraction'], r['interpretable_ci'])} | {_f(r['robust_fraction'], r['robust_ci'])} | "
                     f"{_f(r['reliability'])} | {_f(r['mean_heldout_score'])} |")
    lines += ["", "## Definitions side by side (interpretable / robust on all slices)", "",
              "| definition | " + " | ".join(k for k, _ in ms) + " | controls near zero? |",
              "|---|" + "---|" * (len(ms) + 1)]
    for d in s["definitions"]:
        cells = []
        for _, r in ms:
            x = r["definitions"][d["name"]]
            cells.append(f"{_f(x['interpretable_fraction'], x['interpretable_ci'])} / "
                         f"{_f(x['robust_fraction'], x['robust_ci'])}")
        v = s["verdict"][d["name"]]
        near = "; ".join(f"{fig}: {'yes' if v[fig]['controls_near_zero'] else 'NO'}" for fig in ("interpretable", "robust"))
        lines.append(f"| {d['label']} | " + " | ".join(cells) + f" | {near} |")
    lines += ["", f"\"Near zero\": both controls at or below {NEAR_ZERO}. A definition whose controls are not near "
              "zero scores something other than the trained model's mechanisms (for example the text's own "
              "structure, or what any weight of this architecture does), and its fractions for the trained "
              "models should not be read as interpretability.", "",
              "Examples: MODEL/explain/report.md (the `ours` choices).", "", "![sparse vs dense](sparse_vs_dense.png)"]
    return "\n".join(lines) + "\n"


def plot(out: Path, s: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = models(s)
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = [d["name"] for d in s["definitions"]]
    width = 0.8 / len(ms)
    for j, (k, r) in enumerate(ms):
        xs = [i + (j - (len(ms) - 1) / 2) * width for i in range(len(names))]
        ys = [r["definitions"][n]["interpretable_fraction"] or 0.0 for n in names]
        cis = [r["definitions"][n]["interpretable_ci"] or (y, y) for n, y in zip(names, ys)]
        a.bar(xs, ys, width, label=k, color=f"C{j}",
              yerr=[[y - lo for y, (lo, _) in zip(ys, cis)], [hi - y for y, (_, hi) in zip(ys, cis)]], capsize=2)
        ys_r = [r["definitions"][n]["robust_fraction"] or 0.0 for n in names]
        a.scatter(xs, ys_r, marker="_", s=120, color="k", zorder=3, label="robust (all slices)" if j == 0 else None)
    a.set_xticks(range(len(names)), names)
    a.set(ylabel="fraction of scored weights", title="interpretable (bars, 95% Wilson) and robust (ticks)")
    a.legend(fontsize=8)
    for j, (k, r) in enumerate(ms):
        scores = [v for v in r["scores"] if v is not None]
        if scores:
            b.hist(scores, bins=20, range=(0, 1), histtype="step", lw=1.5, color=f"C{j}", label=k)
    b.axvline(s["threshold"], color="k", ls=":", lw=0.8)
    b.set(xlabel="held-out score min(R, 1 - I) of the best predicate (ours)", ylabel="weights",
          title="score distribution")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "sparse_vs_dense.png", dpi=110)
    plt.close(fig)


__all__ = ["NEAR_ZERO", "markdown", "models", "plot", "verdict"]
