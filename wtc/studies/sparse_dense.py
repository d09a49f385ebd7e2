"""Sparse vs dense: are single weights of weight-sparse transformers more often explained by one
short predicate than those of dense ones? (issue 7; Marin-Llobet & Heimersheim report 17-35% of
nonzero weights interpretable in sparse models vs 5-9% in dense ones).

One corpus (the Python standard library sources, wtc.explain.corpus, split by file), one model shape
(wtc.models.sparse.lm_config: 2 layers, d_model 128, RMSNorm, byte vocabulary), two trainings with
the same data, steps and seed: dense, and weight-sparse (top-k per matrix annealed to `density`
over the first half, AbsTopK 1/4 on the MLP). Then the same explanation procedure on both
(wtc.explain.explainer: `sample` weights drawn uniformly from the nonzero matrix weights, grammar
predicates, exact conditional-ablation scores on held-out text, K = 10 slices). Everything is
resumable: training from its checkpoints, explanations from their summary.json.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from wtc.errors import StudyError
from wtc.explain import report as explain_report
from wtc.models.sparse import SparseTrainConfig, lm_config, nonzero_fraction, train_lm
from wtc.models import Transformer
from wtc.models import io as model_io
from wtc.studies.clock import Clock, study_dir
from wtc.explain.corpus import build_corpus


@dataclass
class SparseDenseStudy:
    steps: int = 6000
    batch: int = 32
    lr: float = 3e-3
    density: float = 0.02             # target nonzero fraction per matrix (plus >= 4 per unit)
    abstopk: float | None = 0.25      # sparse model's AbsTopK fraction (the dense model has none)
    n_layers: int = 2
    d_model: int = 128
    ctx: int = 128
    sample: int = 200                 # weights explained per model
    slices: int = 10
    n_search: int = 32                # search windows (predicates chosen here)
    n_slice: int = 16                 # windows per held-out slice
    max_bytes: int | None = None      # corpus cap (None: the whole default stdlib corpus)
    seed: int = 0
    threads: int = 2

    @classmethod
    def quick(cls) -> SparseDenseStudy:
        return cls(steps=3000, batch=16, sample=150, n_slice=8)

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "n_layers", "d_model", "ctx", "sample", "slices", "n_search", "n_slice",
                     "threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise StudyError(f"SparseDenseStudy.{name} must be a positive int, got {v!r}")
        if not 0 < self.density < 1:
            raise StudyError(f"SparseDenseStudy.density must be in (0, 1), got {self.density}")
        if self.d_model % 32:
            raise StudyError(f"SparseDenseStudy.d_model must be a multiple of 32 (heads of 32), got {self.d_model}")


CONFIG = SparseDenseStudy
# summary keys `wtc study sparse-vs-dense` prints (dotted: into the dense / sparse objects)
HEADLINE = tuple(f"{kind}.{key}" for kind in ("dense", "sparse")
                 for key in ("density", "heldout_loss", "weights_scored", "interpretable_fraction", "robust_fraction",
                             "reliability"))
OUTPUTS = ("summary.json", "report.md", "sparse_vs_dense.png")


def _model(cfg: SparseDenseStudy, sparse: bool) -> Transformer:
    shape = lm_config(abstopk=cfg.abstopk if sparse else None, n_layers=cfg.n_layers, d_model=cfg.d_model,
                      n_heads=cfg.d_model // 32, d_head=32, d_mlp=4 * cfg.d_model, n_ctx=cfg.ctx)
    return Transformer(shape, seed=cfg.seed)


def run(cfg: SparseDenseStudy | None, out_dir, progress: bool = True) -> dict:
    """Train both models (resumably, cfg.threads torch threads), explain both; writes summary.json,
    report.md and sparse_vs_dense.png; returns the summary."""
    cfg = cfg or SparseDenseStudy()
    if not isinstance(cfg, SparseDenseStudy):
        raise StudyError(f"cfg must be a SparseDenseStudy, got {type(cfg).__name__}")
    out = study_dir(out_dir, StudyError)
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(out)
    corpus = build_corpus(max_bytes=cfg.max_bytes, seed=cfg.seed)
    corpus.save_manifest(out / "corpus_manifest.json")
    train_tokens, held = corpus.tokens("train"), corpus.tokens("heldout")
    result = {}
    for kind in ("dense", "sparse"):
        model = _model(cfg, kind == "sparse")
        tcfg = SparseTrainConfig(steps=cfg.steps, batch=cfg.batch, lr=cfg.lr, seed=cfg.seed, threads=cfg.threads,
                                 density=cfg.density if kind == "sparse" else 1.0,
                                 eval_every=max(cfg.steps // 10, 1))
        trained = train_lm(model, train_tokens, tcfg, out=out / kind / "train", heldout_tokens=held,
                           progress=progress)
        model_io.save(model, out / kind / "model", extra={"study": "sparse-vs-dense", "kind": kind,
                                                         "train": asdict(tcfg)})
        dens = nonzero_fraction(model, matrices_only=True)
        summary = explain_report.run(model, corpus, out / kind / "explain", sample=cfg.sample, seed=cfg.seed,
                                     k=cfg.slices, n_search=cfg.n_search, n_slice=cfg.n_slice, progress=progress,
                                     label=f"{kind} model")
        result[kind] = {k: summary[k] for k in ("weights_sampled", "weights_scored", "interpretable_fraction",
                                                 "robust_fraction", "reliability", "mean_heldout_score")}
        result[kind].update(heldout_loss=trained["heldout_loss"], train_loss=trained["train_loss"],
                            train_seconds=round(trained["seconds"], 1), explain_seconds=summary["seconds"],
                            density=sum(dens.values()) / len(dens), densities=dens,
                            scores=[w["heldout_score"] for w in json.loads(
                                (out / kind / "explain" / "explanations.json").read_text())])
    summary = {"config": asdict(cfg), "corpus": {"sha256": corpus.manifest()["sha256"], "files": len(corpus.files),
                                                 "train_bytes": corpus.n_bytes("train"),
                                                 "heldout_bytes": corpus.n_bytes("heldout")},
               **result, "seconds": round(clock.total(), 1)}
    clock.save()
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(out, summary)
    (out / "report.md").write_text(markdown(summary))
    return summary


def plot(out: Path, s: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    kinds = ("dense", "sparse")
    x = range(2)
    a.bar([i - 0.2 for i in x], [s[k]["interpretable_fraction"] or 0 for k in kinds], 0.4, label="interpretable")
    a.bar([i + 0.2 for i in x], [s[k]["robust_fraction"] or 0 for k in kinds], 0.4, label="robust (all 10 slices)")
    a.set_xticks(list(x), [f"{k}\n(density {s[k]['density']:.3f}, loss {s[k]['heldout_loss']:.2f})" for k in kinds])
    a.set(ylabel="fraction of scored weights", title="weights explained by one predicate (score >= 0.75)")
    a.legend(fontsize=8)
    for k, color in zip(kinds, ("C0", "C1")):
        scores = [v for v in s[k]["scores"] if v is not None]
        if scores:
            b.hist(scores, bins=20, range=(0, 1), alpha=0.6, color=color, label=k)
    b.axvline(0.75, color="k", ls=":", lw=0.8)
    b.set(xlabel="held-out score min(R, 1 - I) of the best predicate", ylabel="weights", title="score distribution")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "sparse_vs_dense.png", dpi=110)
    plt.close(fig)


def markdown(s: dict) -> str:
    c = s["config"]
    rows = ["| model | density | held-out loss (nats/byte) | scored | interpretable | robust | reliability | mean score |",
            "|---|---|---|---|---|---|---|---|"]
    for k in ("dense", "sparse"):
        r = s[k]
        rows.append(f"| {k} | {r['density']:.4f} | {r['heldout_loss']:.3f} | {r['weights_scored']} | "
                    f"{explain_report._fmt(r['interpretable_fraction'])} | {explain_report._fmt(r['robust_fraction'])} | "
                    f"{explain_report._fmt(r['reliability'])} | {explain_report._fmt(r['mean_heldout_score'])} |")
    return "\n".join([f"# Sparse vs dense ({c['steps']} steps, batch {c['batch']}, target density {c['density']}, "
                      f"{c['sample']} weights each, {s['seconds']} s)", "",
                      f"Corpus: {s['corpus']['files']} stdlib files, {s['corpus']['train_bytes']} train / "
                      f"{s['corpus']['heldout_bytes']} held-out bytes (sha256 {s['corpus']['sha256'][:12]}).", ""]
                     + rows + ["", "Examples: dense/explain/report.md, sparse/explain/report.md.", "",
                               "![sparse vs dense](sparse_vs_dense.png)"]) + "\n"


__all__ = ["CONFIG", "HEADLINE", "OUTPUTS", "SparseDenseStudy", "StudyError", "run"]
