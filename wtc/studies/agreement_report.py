"""The agreement study's figure and report (wtc.studies.agreement)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def plot(out: Path, s: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 4))
    for r in s["models"]:
        prof = r["layer_profile"]
        a.plot(range(len(prof)), [p["flip_reversal"] for p in prof], marker="o", label=f"{r['name']} flip")
        a.plot(range(len(prof)), [p["r2"] for p in prof], marker="x", ls="--", label=f"{r['name']} R²")
    a.set(xlabel="layer (hook_resid_post)", ylabel="share", title="layer profile", ylim=(-0.02, 1.02))
    a.legend(fontsize=6)
    names = [r["name"] for r in s["models"]]
    x = np.arange(len(names))
    for k, key in enumerate(("baseline_acc", "keep_acc", "remove_acc", "flip_acc", "flip_reversal", "generation_flip")):
        b.bar(x + (k - 2.5) * 0.13, [r[key] for r in s["models"]], 0.13, label=key)
    b.set_xticks(x, names, rotation=20, fontsize=6)
    b.set(title="keep / remove / flip (attractor set)", ylim=(0, 1.05))
    b.legend(fontsize=6)
    im = c.imshow(np.array(s["spearman"]), vmin=-1, vmax=1, cmap="coolwarm")
    c.set_xticks(x, names, rotation=20, fontsize=6)
    c.set_yticks(x, names, fontsize=6)
    for i in range(len(names)):
        for j in range(len(names)):
            c.text(j, i, f"{s['spearman'][i][j]:.2f}", ha="center", va="center", fontsize=7)
    c.set_title("Spearman of the 1-D coordinate")
    fig.colorbar(im, ax=c)
    fig.tight_layout()
    fig.savefig(out / "agreement.png", dpi=120)
    plt.close(fig)


def markdown(s: dict) -> str:
    def f(v):
        return "n/a" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    rows = ["| model | rank | suff / nec | baseline | keep | remove | flip acc | flip reversal | generation flip | "
            "R² | lemma acc (attr / no attr) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in s["models"]:
        rows.append(f"| {r['name']} | {r['rank']} | {f(r['minimal_sufficient_rank'])} / {f(r['minimal_necessary_rank'])} | "
                    f"{f(r['baseline_acc'])} | {f(r['keep_acc'])} | {f(r['remove_acc'])} | {f(r['flip_acc'])} | "
                    f"{f(r['flip_reversal'])} | {f(r['generation_flip'])} | {f(r['r2'])} | "
                    f"{f(r['lemma_acc'])} / {f(r['no_attractor_lemma_acc'])} |")
    prof = ["", "Layer profile (rank / R² / flip reversal at each hook_resid_post):", ""]
    for r in s["models"]:
        prof.append(f"- {r['name']}: " + "; ".join(f"L{i} {p['rank']} / {p['r2']:.3f} / {p['flip_reversal']:.3f}"
                                                 for i, p in enumerate(r["layer_profile"])))
    dist = ["", "Agreement accuracy (own verb) by distance on the attractor set:", ""]
    for r in s["models"]:
        dist.append(f"- {r['name']}: " + ", ".join(f"{d}: {v:.3f}" for d, v in r["lemma_acc_by_distance"].items()))
    names = [r["name"] for r in s["models"]]
    n_amb = s.get("ambiguous_n", 0)
    what = (f"the same {s['eval_n']} attractor sentences and {n_amb} held-out sentences whose subject is "
            f"number-ambiguous (corpus {s.get('corpus')}: they are the corpus's share of such subjects; accuracy, "
            "keep / remove / flip and generation are measured on the attractor sentences only, which have a "
            "definite number)") if n_amb else "the same attractor sentences"
    sp = ["", f"Spearman of the 1-D coordinate over {what}:", "",
          "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for n, row in zip(names, s["spearman"]):
        sp.append(f"| {n} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
    sp += ["", "The same within each subject number (attractor sentences; the mean over singular and plural sentences; "
           "the class split alone gives 0.75 for two equal classes the coordinates separate):", "",
           "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for n, row in zip(names, s["spearman_within_number"]):
        sp.append(f"| {n} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
    if n_amb:
        for key, title in (("spearman_definite", "The same over the attractor sentences alone (the uniform corpus's set)"),
                           ("spearman_ambiguous", "The same over the ambiguous-subject sentences alone (the graded order "
                                                  "inside, not only their place between the numbers)")):
            sp += ["", title + ":", "", "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
            for n, row in zip(names, s[key]):
                sp.append(f"| {n} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
        sp += ["", "Spearman of each coordinate with the ambiguous nouns' P(plural verb): "
               + ", ".join(f"{n} {v:.3f}" for n, v in zip(names, s["prior_spearman"])),
               "", "Mean plural share of the verb forms' mass per ambiguous noun, by its P(plural verb) "
               "(" + ", ".join(f"{p:g}" for p in s["prior_calibration"]["p"]) + "):", ""]
        for n, row in zip(names, s["prior_calibration"]["models"]):
            sp.append(f"- {n}: " + ", ".join(f"{v:.2f}" for v in row))
    if "spearman_margin" in s:
        def mn(key):
            v = s.get(key)
            return "n/a" if v is None else f"{v:.3f}"
        sp += ["", "What bounds it (minimum over model pairs; wtc.studies.agreement_compare):", "",
               f"- the models' own margins over the same sentences: {mn('min_spearman_margin')} "
               f"(within number {mn('min_spearman_margin_within_number')})",
               f"- the coordinate over attractor + no-attractor sentences: {mn('min_spearman_mixed')} "
               f"(within number {mn('min_spearman_mixed_within_number')})",
               "- within-number r of each coordinate with its own model's margin: "
               + ", ".join(f"{n} {v:.3f}" for n, v in zip(names, s["coordinate_margin_r_within_number"]))]
    c = s["config"]
    head = (f"# Agreement study ({'model ' + str(c['model']) if c['model'] else str(len(names)) + ' trained models, ' + str(c['steps']) + ' steps'}; "
            f"corpus {c.get('corpus', 'uniform')}; {s['seconds']} s)")
    return "\n".join([head, "", f"Core of the last layer's residual stream at the verb-predicting position, readout "
                      f"(log P(singular verbs), log P(plural verbs)); fitted on {s['fit_n']} held-out sentences, evaluated "
                      f"on {s['eval_n']} held-out attractor sentences. Chance 0.5.", ""] + rows + prof + dist + sp +
                     ["", "![agreement](agreement.png)"]) + "\n"
