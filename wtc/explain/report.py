"""`wtc explain`: predicate explanations of a trained model on held-out corpus text, written as
summary.json, explanations.json and report.md (used by the sparse-vs-dense study too). A byte-level
model reads the corpus's bytes; a model with a tokenizer (Hugging Face) reads the corpus tokenised
by it, and its predicates are over the decoded token strings (wtc.explain.token_predicates)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wtc.explain.explainer import explain, to_json
from wtc.explain.corpus import Corpus, slices
from wtc.explain.token_predicates import encode_corpus


TOKEN_CTX = 64           # default window of a model with a tokenizer


@dataclass(frozen=True)
class Effort:
    """How much work one explain run does: weights explained (`sample`), held-out slices judged on
    (`k`) and windows per slice (`n_slice`), search windows the predicate is chosen on (`n_search`),
    and the predicate search's width: grammar candidates re-scored exactly, beam, atoms per predicate."""
    sample: int = 100
    k: int = 10
    n_search: int = 32
    n_slice: int = 16
    candidates: int = 5
    beam: int = 10
    max_atoms: int = 3


FULL = Effort()
QUICK = Effort(sample=20, k=4, n_search=16, n_slice=8, candidates=3, beam=5, max_atoms=2)
"""`wtc explain --quick`: a first look in a minute or two. It trades: 20 weights (fractions +-10%
instead of +-5%), predicates chosen on half the search text, robustness judged on 4 slices of 8
windows (easier to pass than 10 of 16: robust fractions are not comparable with a full run), and a
narrower search (3 candidates, beam 5, at most 2 atoms: a weight needing a 3-atom predicate stays
unexplained)."""


@dataclass
class HeldoutSets:
    search: np.ndarray                 # (n_search, ctx): predicates are proposed and chosen here
    slices: list[np.ndarray]           # K disjoint (n_slice, ctx) sets: the chosen predicate is judged here


def heldout_sets(corpus: Corpus, ctx: int, n_search: int = 32, n_slice: int = 16, k: int = 10,
                 seed: int = 0, tokenizer=None) -> HeldoutSets:
    """Disjoint windows of the corpus's held-out split (its bytes, or its text tokenised by
    `tokenizer`): 2 slices' worth for the search set (n_search, rounded up to whole slices) and K
    slices to judge on."""
    per = n_slice
    n_search_slices = -(-n_search // per)
    held = corpus.tokens("heldout") if tokenizer is None else encode_corpus(corpus, "heldout", tokenizer)
    sets = slices(held, ctx, per, k + n_search_slices, seed)
    return HeldoutSets(np.concatenate(sets[:n_search_slices]), sets[n_search_slices:])


def run(model, corpus: Corpus, out, sample: int = 100, seed: int = 0, ctx: int | None = None, k: int = 10,
        n_search: int = 32, n_slice: int = 16, params=None, proposer=None, progress: bool = True,
        label: str = "model", proposer_timeout_s: float = 60.0, tokenizer=None, candidates: int = 5,
        beam: int = 10, max_atoms: int = 3) -> dict:
    """Explain `sample` weights of `model`; writes out/{summary.json, explanations.json, report.md}
    and returns the summary (with the examples). A finished out/ with the same settings is reused.
    tokenizer: the model's (default: its own `tokenizer`, Hugging Face models; None: bytes); ctx
    defaults to the model's context, at most TOKEN_CTX tokens with a tokenizer (a window's logits
    are ctx x vocab doubles per copy)."""
    out = Path(out)
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tokenizer is None:
        ctx = ctx or model.cfg.n_ctx
    else:
        from wtc.scan.inputs import context_size
        ctx = ctx or min(context_size(model) or TOKEN_CTX, TOKEN_CTX)
    settings = {"sample": sample, "seed": seed, "ctx": ctx, "k": k, "n_search": n_search, "n_slice": n_slice,
                "params": params, "corpus_sha256": corpus.manifest()["sha256"], "external_proposer": proposer is not None}
    if (candidates, beam, max_atoms) != (FULL.candidates, FULL.beam, FULL.max_atoms):   # a finished default run stays reusable
        settings.update(candidates=candidates, beam=beam, max_atoms=max_atoms)
    if proposer is not None:
        settings["proposer_timeout_s"] = proposer_timeout_s
    if tokenizer is not None:
        settings["tokenizer"] = f"{type(tokenizer).__name__} ({len(tokenizer)} tokens)"
    done = out / "summary.json"
    if done.exists():
        old = json.loads(done.read_text())
        if old.get("settings") == settings:
            return old
    t0 = time.perf_counter()
    sets = heldout_sets(corpus, ctx, n_search, n_slice, k, seed, tokenizer=tokenizer)
    result = explain(model, sets.search, sets.slices, sample=sample, params=params, seed=seed, proposer=proposer,
                     progress=progress, proposer_timeout_s=proposer_timeout_s, tokenizer=tokenizer,
                     candidates=candidates, beam=beam, max_atoms=max_atoms)
    data = to_json(result)
    out.mkdir(parents=True, exist_ok=True)
    (out / "explanations.json").write_text(json.dumps(data["weights"], indent=1))
    summary = {**data["summary"], "settings": settings, "label": label, "seconds": round(time.perf_counter() - t0, 1),
               "examples": examples(data["weights"], 8)}
    (out / "report.md").write_text(markdown(summary, label))
    done.write_text(json.dumps(summary, indent=2))
    return summary


def examples(weights: list[dict], n: int) -> list[dict]:
    """The n best-explained weights (held-out score), with predicate, source and contexts."""
    scored = sorted((w for w in weights if w["heldout_score"] is not None), key=lambda w: -w["heldout_score"])
    return [{k: w[k] for k in ("param", "index", "predicate", "source", "coverage", "search_score", "heldout_score",
                               "interpretable", "robust", "examples")} for w in scored[:n]]


def _fmt(v):
    return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))


def markdown(s: dict, label: str) -> str:
    lines = [f"# Predicate explanations: {label}", "",
             f"- weights sampled {s['weights_sampled']}, scored (nonzero effect) {s['weights_scored']}",
             f"- interpretable (held-out score >= {s['threshold']}): {_fmt(s['interpretable_fraction'])}; robust "
             f"(every one of {s['slices']} slices): {_fmt(s['robust_fraction'])}; reliability (between-weight "
             f"share of score variance): {_fmt(s['reliability'])}; mean held-out score {_fmt(s['mean_heldout_score'])}",
             f"- search set {s['search_positions']} positions; coverage gate 0 < p(f) <= {s['max_coverage']}; "
             f"{s['seconds']} s"]
    if s.get("tokenizer"):
        lines.append(f"- tokens: the model's own ({s['tokenizer']}); predicates read their decoded strings")
    if s.get("proposer_gave_up"):
        lines.append(f"- external proposer: {s['proposer_gave_up']}")
    lines += ["", "## Best-explained weights", ""]
    for e in s["examples"]:
        lines += [f"### {e['param']}{e['index']}: held-out score {_fmt(e['heldout_score'])} "
                  f"({'robust' if e['robust'] else 'interpretable' if e['interpretable'] else 'not interpretable'})",
                  "", f"`{e['predicate']}` (coverage {_fmt(e['coverage'])})", "", "```python", e["source"].rstrip(),
                  "```", "", "Contexts where zeroing it matters most (up to the position):", ""]
        lines += [f"- `{c!r}`" for c in e["examples"][:3]]
        lines.append("")
    return "\n".join(lines) + "\n"


__all__ = ["run", "heldout_sets", "HeldoutSets", "examples", "markdown"]
