"""Sparse vs dense: are single weights of weight-sparse transformers more often explained by one
short predicate than those of dense ones? (issues 7 and 19; Marin-Llobet & Heimersheim report 17-35%
of nonzero weights interpretable in sparse models vs 5-9% in dense ones).

One corpus (the Python standard library sources, wtc.explain.corpus, split by file), one model shape
(wtc.models.sparse.lm_config: 2 layers, d_model 128, RMSNorm, byte vocabulary), two trainings with
the same data, steps and seed: dense, and weight-sparse (top-k per matrix annealed to `density`
over the first half, AbsTopK 1/4 on the MLP). Two controls (wtc.studies.sparse_dense_controls): the
dense architecture untrained (`random`) and trained on the same bytes shuffled within every
sequence (`shuffled`). Then the same explanation procedure on all four (`sample` weights drawn
uniformly from the nonzero matrix weights, grammar predicates, exact conditional-ablation scores on
held-out text, K = 10 slices), judged under several definitions of "interpretable"
(wtc.studies.sparse_dense_defs: ours, a coverage gate per slice, <= 2 atoms, and a strict "one
short predicate" row), each fraction with a 95% Wilson interval. Everything is resumable: training
from its checkpoints, explanations weight by weight from their weights.jsonl.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from wtc.arguments import seed as seed_arg
from wtc.errors import StudyError
from wtc.explain import report as explain_report
from wtc.explain.corpus import build_corpus
from wtc.models import Transformer
from wtc.models import io as model_io
from wtc.models.sparse import SparseTrainConfig, lm_config, lm_loss, eval_windows, nonzero_fraction, train_lm
from wtc.studies import sparse_dense_defs as defs
from wtc.studies import sparse_dense_report as report
from wtc.studies.clock import Clock, study_dir
from wtc.studies.sparse_dense_controls import CONTROLS, shuffle_within_blocks

MODELS = ("dense", "sparse") + CONTROLS


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
    sample: int = 500                 # weights explained per model
    slices: int = 10
    n_search: int = 32                # search windows (predicates chosen here)
    n_slice: int = 16                 # windows per held-out slice
    candidates: int = 5               # grammar predicates re-scored exactly per search (the explainer's default)
    max_bytes: int | None = None      # corpus cap (None: the whole default stdlib corpus)
    seed: int = 0
    threads: int = 1

    @classmethod
    def quick(cls) -> SparseDenseStudy:
        return cls(steps=3000, batch=16, sample=100, n_slice=8, candidates=3)

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "n_layers", "d_model", "ctx", "sample", "slices", "n_search", "n_slice",
                     "candidates", "threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise StudyError(f"SparseDenseStudy.{name} must be a positive int, got {v!r}")
        for name in ("lr", "density") + (("abstopk",) if self.abstopk is not None else ()):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
                raise StudyError(f"SparseDenseStudy.{name} must be a finite number, got {v!r}")
            setattr(self, name, v.item() if isinstance(v, (np.integer, np.floating)) else v)   # config.json
        if not self.lr > 0:
            raise StudyError(f"SparseDenseStudy.lr must be > 0, got {self.lr}")
        if not 0 < self.density < 1:
            raise StudyError(f"SparseDenseStudy.density must be in (0, 1), got {self.density}")
        if self.abstopk is not None and not 0 < self.abstopk <= 1:
            raise StudyError(f"SparseDenseStudy.abstopk must be None or a fraction in (0, 1], got {self.abstopk}")
        self.seed = seed_arg(self.seed, "SparseDenseStudy.seed", StudyError)
        if self.max_bytes is not None and (not isinstance(self.max_bytes, int) or isinstance(self.max_bytes, bool)
                                           or self.max_bytes < 1):
            raise StudyError(f"SparseDenseStudy.max_bytes must be None or a positive int, got {self.max_bytes!r}")
        if self.d_model % 32:
            raise StudyError(f"SparseDenseStudy.d_model must be a multiple of 32 (heads of 32), got {self.d_model}")


CONFIG = SparseDenseStudy
# summary keys `wtc study sparse-vs-dense` prints (dotted: into the model objects)
HEADLINE = tuple(f"{kind}.{key}" for kind in ("dense", "sparse", "controls.random", "controls.shuffled")
                 for key in ("heldout_loss", "weights_scored", "interpretable_fraction", "robust_fraction",
                             "definitions.strict.interpretable_fraction"))
OUTPUTS = ("summary.json", "report.md", "sparse_vs_dense.png")
_KEEP = ("weights_sampled", "weights_scored", "interpretable_fraction", "interpretable_ci", "robust_fraction",
         "robust_ci", "reliability", "mean_heldout_score", "definitions")


def _model(cfg: SparseDenseStudy, sparse: bool) -> Transformer:
    shape = lm_config(abstopk=cfg.abstopk if sparse else None, n_layers=cfg.n_layers, d_model=cfg.d_model,
                      n_heads=cfg.d_model // 32, d_head=32, d_mlp=4 * cfg.d_model, n_ctx=cfg.ctx)
    return Transformer(shape, seed=cfg.seed)


def _train_config(cfg: SparseDenseStudy, kind: str) -> SparseTrainConfig:
    return SparseTrainConfig(steps=cfg.steps, batch=cfg.batch, lr=cfg.lr, seed=cfg.seed, threads=cfg.threads,
                             density=cfg.density if kind == "sparse" else 1.0, eval_every=max(cfg.steps // 10, 1))


def prepare(cfg: SparseDenseStudy, out: Path, kind: str, corpus, progress: bool = True) -> tuple[Transformer, dict]:
    """The model of `kind` (one of MODELS), trained (resumably) unless it is the random control,
    saved under out/kind/model; returns (model, training figures)."""
    if kind not in MODELS:
        raise StudyError(f"unknown model kind {kind!r} (one of {', '.join(MODELS)})")
    model = _model(cfg, kind == "sparse")
    tcfg = _train_config(cfg, kind)
    extra = {"study": "sparse-vs-dense", "kind": kind, "train": asdict(tcfg) if kind != "random" else None,
             "corpus_sha256": corpus.manifest()["sha256"]}     # the shuffled bytes follow from it and the seed
    saved = _saved(out / kind, model, extra)
    if saved is not None:
        return saved
    (out / kind / "figures.json").unlink(missing_ok=True)      # never paired with a model it does not describe
    held = corpus.tokens("heldout")
    if kind == "random":
        import torch
        torch.set_num_threads(cfg.threads)
        loss = lm_loss(model, eval_windows(held, cfg.ctx, tcfg.eval_windows), cfg.batch)
        train_loss = lm_loss(model, eval_windows(corpus.tokens("train"), cfg.ctx, tcfg.eval_windows), cfg.batch)
        figures = {"heldout_loss": loss, "train_loss": train_loss, "train_seconds": 0.0, "trained": False}
    else:
        tokens = corpus.tokens("train")
        if kind == "shuffled":
            tokens = shuffle_within_blocks(tokens, cfg.ctx + 1, cfg.seed)
        trained = train_lm(model, tokens, tcfg, out=out / kind / "train", heldout_tokens=held, progress=progress)
        figures = {"heldout_loss": trained["heldout_loss"], "train_loss": trained["train_loss"],
                   "train_seconds": round(trained["seconds"], 1), "trained": True}
    model_io.save(model, out / kind / "model", extra=extra)
    dens = nonzero_fraction(model, matrices_only=True)
    figures.update(density=sum(dens.values()) / len(dens), densities=dens)
    (out / kind / "figures.json").write_text(json.dumps(figures, indent=1))
    return model, figures


def _saved(d: Path, fresh: Transformer, extra: dict) -> tuple[Transformer, dict] | None:
    """The model an earlier run finished and saved in d/model (with d/figures.json) for this shape and
    training config, or None. Loaded rather than retrained, because a retraining on another CPU can
    differ in the last bits, and the explanations kept in d/explain belong to the saved weights."""
    from wtc import checkpoint_io

    if not (d / "figures.json").exists() or not checkpoint_io.exists(d / "model" / "model"):
        return None
    _, meta = checkpoint_io.read(d / "model" / "model")     # model_io.save's pair: d/model/model.{json,safetensors}
    same = lambda a, b: json.loads(json.dumps(a)) == json.loads(json.dumps(b))     # noqa: E731 (tuples vs lists)
    if not same(meta.get("extra"), extra) or not same(meta.get("config"), asdict(fresh.cfg)):
        return None
    return model_io.load(d / "model"), json.loads((d / "figures.json").read_text())


def _settings(cfg: SparseDenseStudy, corpus) -> dict:
    return {"ctx": cfg.ctx, "k": cfg.slices, "n_search": cfg.n_search, "n_slice": cfg.n_slice,
            "corpus_sha256": corpus.manifest()["sha256"]}


def explain(cfg: SparseDenseStudy, out: Path, kind: str, model: Transformer, corpus, progress: bool = True,
            budget_s: float | None = None, max_weights: int | None = None) -> dict | None:
    """Explain cfg.sample weights of `model` under every definition (resumably, out/kind/explain/);
    writes summary.json, explanations.json (the `ours` choices) and report.md there once finished.
    Returns the summary, or None when budget_s / max_weights stopped it first."""
    import torch
    torch.set_num_threads(cfg.threads)
    where = out / kind / "explain"
    sets = explain_report.heldout_sets(corpus, cfg.ctx, cfg.n_search, cfg.n_slice, cfg.slices, cfg.seed)
    records, finished = defs.explain_all(model, sets.search, sets.slices, where, cfg.sample, cfg.seed,
                                         _settings(cfg, corpus), progress=progress, label=kind, budget_s=budget_s,
                                         max_weights=max_weights, candidates=cfg.candidates)
    if not finished:
        return None
    s = defs.summarise(records)
    expl = defs.to_explanations(records)
    (where / "explanations.json").write_text(json.dumps(expl, indent=1))
    md = {**s, "threshold": defs.THRESHOLD, "slices": cfg.slices, "max_coverage": defs.DEFINITIONS[0].max_coverage,
          "search_positions": int(sets.search.size), "seconds": "-", "examples": explain_report.examples(expl, 8)}
    (where / "report.md").write_text(explain_report.markdown(md, f"{kind} model"))
    s["scores"] = [w["heldout_score"] for w in expl]
    (where / "summary.json").write_text(json.dumps(s, indent=2))
    return s


def run(cfg: SparseDenseStudy | None, out_dir, progress: bool = True) -> dict:
    """Train the three trained models (resumably, cfg.threads torch threads), explain all four;
    writes summary.json, report.md and sparse_vs_dense.png; returns the summary."""
    cfg = cfg or SparseDenseStudy()
    if not isinstance(cfg, SparseDenseStudy):
        raise StudyError(f"cfg must be a SparseDenseStudy, got {type(cfg).__name__}")
    out = study_dir(out_dir, StudyError)
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(out)
    corpus = build_corpus(max_bytes=cfg.max_bytes, seed=cfg.seed)
    corpus.save_manifest(out / "corpus_manifest.json")
    for kind in MODELS:
        model, _ = prepare(cfg, out, kind, corpus, progress)
        explain(cfg, out, kind, model, corpus, progress)
        clock.save()
    summary = write_summary(cfg, out, corpus, seconds=round(clock.total(), 1))
    clock.save()
    return summary


def write_summary(cfg: SparseDenseStudy, out, corpus, seconds: float | None = None) -> dict:
    """summary.json, report.md and the plot from what out/ holds: finished models in full, a model
    still being explained from its finished weights (its `finished` is False), a model not yet
    prepared left out (None). A run in pieces reports its progress with this."""
    out = Path(out)
    result = {}
    for kind in MODELS:
        fig_path, where = out / kind / "figures.json", out / kind / "explain"
        records = defs.load_records(where)
        if not fig_path.exists() or not records:
            result[kind] = None
            continue
        s = defs.summarise(records)
        scores = [(r["defs"].get("ours") or {}).get("heldout_score") for r in records]
        result[kind] = {**{k: s[k] for k in _KEEP}, **json.loads(fig_path.read_text()), "scores": scores,
                        "finished": len(records) == cfg.sample}
    summary = {"config": asdict(cfg), "corpus": {"sha256": corpus.manifest()["sha256"], "files": len(corpus.files),
                                                 "train_bytes": corpus.n_bytes("train"),
                                                 "heldout_bytes": corpus.n_bytes("heldout")},
               "dense": result["dense"], "sparse": result["sparse"],
               "controls": {k: result[k] for k in CONTROLS},
               "definitions": [{"name": d.name, "label": d.label, "max_atoms": d.max_atoms,
                                "max_coverage": d.max_coverage, "slice_gate": d.slice_gate} for d in defs.DEFINITIONS],
               "ci": "95% Wilson score interval", "threshold": defs.THRESHOLD,
               "finished": all(r is not None and r["finished"] for r in result.values()), "seconds": seconds}
    summary["verdict"] = report.verdict(summary) if all(r is not None for r in result.values()) else None
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if summary["verdict"] is not None:
        report.plot(out, summary)
        (out / "report.md").write_text(report.markdown(summary))
    return summary


__all__ = ["CONFIG", "HEADLINE", "MODELS", "OUTPUTS", "SparseDenseStudy", "StudyError", "explain", "prepare", "run", "write_summary"]
