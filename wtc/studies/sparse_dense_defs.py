"""Per-weight explanations under several definitions of "interpretable", one pass per model
(used by the sparse-vs-dense study for all four of its models: sparse, dense and the two controls).

The pipeline is wtc.explain.explainer's, step for step (the same weight sample, the same exact scan
of each weight's per-position KL on the search set, the same grammar beam search, the same exact
conditional-ablation score min(R, 1 - I), the same K disjoint held-out slices); what differs between
the definitions is which predicates may compete and what counts as a pass:

- ``ours``: the explainer's own rule. Predicates of up to 3 atoms with coverage 0 < p(f) <= 0.5 on
  the search set; interpretable when the score pooled over the K slices is >= 0.75, robust when in
  addition every slice's score is >= 0.75. (`explain()` gives the same answers; tests check it.)
- ``slice_gate``: the same predicate, but the coverage gate is applied on every held-out slice
  too (0 < p_k(f) <= 0.5 on each slice k): a predicate that is narrow on the search set but broad
  elsewhere does not pass.
- ``short``: the search is re-run with at most 2 atoms (same coverage gate, per slice).
- ``strict``: one short predicate: at most 2 atoms and coverage <= 0.2, on the search set and on
  every slice.

The published study (Marin-Llobet & Heimersheim) asks for a short account of when a weight matters
verified on held-out data; "robust" there means on K = 10 disjoint slices. Its exact thresholds are
not restated here; the rows above bracket it from our loose rule to a strict one.

Every fraction comes with a 95% Wilson score interval (the binomial interval that stays inside
[0, 1] and behaves at 0 and n). Work is resumable weight by weight: each finished weight is one
line of ``weights.jsonl`` (with a settings header, which holds the model's parameter hash); a rerun
with the same settings and the same model skips them, anything else is set aside (renamed, kept).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from wtc.explain import predicate_search
from wtc.explain.explainer import Scorer, _context_text, _scores, reliability, sample_weights
from wtc.scan.engine import scan
from wtc.scan.inputs import model_sha256
from wtc.errors import StudyError


@dataclass(frozen=True)
class Definition:
    name: str
    label: str
    max_atoms: int
    max_coverage: float
    slice_gate: bool              # the coverage gate also applies on every held-out slice


DEFINITIONS = (
    Definition("ours", "ours: <= 3 atoms, coverage <= 0.5 on the search set, pooled score", 3, 0.5, False),
    Definition("slice_gate", "coverage gate (<= 0.5) on every slice", 3, 0.5, True),
    Definition("short", "<= 2 atoms, coverage <= 0.5, gate per slice", 2, 0.5, True),
    Definition("strict", "strict: one short predicate (<= 2 atoms, coverage <= 0.2, gate per slice)", 2, 0.2, True),
)
THRESHOLD = 0.75
CHUNK = 20                        # weights scanned together (and the resume granularity of the scan)


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """95% Wilson score interval for k successes out of n (None when n == 0)."""
    if n <= 0:
        return None
    if not 0 <= k <= n:
        raise StudyError(f"wilson: need 0 <= k <= n, got k={k}, n={n}")
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _finite(v):
    return None if v is None or not np.isfinite(v) else float(v)


def _judge(scorers: list[Scorer], name, index, truth, cache: dict, source: str, full: list) -> dict:
    """Per-slice scores and coverages of one predicate, cached by source (definitions often share
    it); `full` caches each slice's per-position KL of zeroing the weight everywhere (A(all) and,
    for weights whose effect stays local, the additive shortcut), computed once per weight."""
    if source not in cache:
        sums, scores, covs = np.zeros(3), [], []
        for k, sc in enumerate(scorers):
            if len(full) <= k:
                full.append(sc.kl_map(name, index))
            F = truth(sc.tokens.numpy())
            a = np.array(sc.triple(name, index, F, full[k]))
            sums += a
            scores.append(_finite(_scores(*a)))
            covs.append(float(F.mean()))
        cache[source] = {"heldout_score": _finite(_scores(*sums)), "slice_scores": scores, "slice_coverages": covs}
    return cache[source]


def explain_weight(name, index, kl: torch.Tensor, search_np: np.ndarray, search_scorer: Scorer,
                   slice_scorers: list[Scorer], definitions=DEFINITIONS, threshold: float = THRESHOLD,
                   beam: int = 10, candidates: int = 5) -> dict:
    """One weight under every definition: {param, index, total_kl, examples, defs: {name: {...}}}."""
    kl_np = kl.numpy()
    rec = {"param": name, "index": [int(i) for i in index], "total_kl": float(kl.sum()), "defs": {}}
    if rec["total_kl"] <= 1e-12:
        rec["note"] = "no effect on the search set"
        return rec
    flat = np.argsort(-kl_np, axis=None)[:5]
    rec["examples"] = [_context_text(search_np[i // kl_np.shape[1]], int(i % kl_np.shape[1])) for i in flat]
    searched, judged, exact, full = {}, {}, {}, []
    for d in definitions:
        key = (d.max_atoms, d.max_coverage)
        if key not in searched:
            found = predicate_search.search(search_np, kl_np, beam=beam, max_atoms=d.max_atoms,
                                            max_coverage=d.max_coverage, top=candidates)
            best = None
            for p, _ in found:
                F = p.evaluate(search_np)
                cov = float(F.mean())
                if not 0 < cov <= d.max_coverage:
                    continue
                if p.source not in exact:          # exact search-set score, once per predicate
                    exact[p.source] = _scores(*search_scorer.triple(name, index, F, kl))
                score = exact[p.source]
                if best is None or score > best[0]:
                    best = (score, p, cov)
            searched[key] = best
        best = searched[key]
        if best is None:
            rec["defs"][d.name] = {"predicate": None, "interpretable": False, "robust": False,
                                   "note": "no candidate predicate within the coverage gate"}
            continue
        score, pred, cov = best
        j = _judge(slice_scorers, name, index, pred.evaluate, judged, pred.source, full)
        pooled = j["heldout_score"]
        gate_ok = all(0 < c <= d.max_coverage for c in j["slice_coverages"]) if d.slice_gate else True
        interp = pooled is not None and pooled >= threshold and gate_ok
        robust = interp and all(s is not None and s >= threshold for s in j["slice_scores"])
        rec["defs"][d.name] = {"predicate": pred.name, "source": pred.source, "atoms": len(pred.atoms),
                               "coverage": cov, "search_score": _finite(score), **j,
                               "gate_ok": bool(gate_ok), "interpretable": bool(interp), "robust": bool(robust)}
    return rec


def summarise(records: list[dict], definitions=DEFINITIONS) -> dict:
    """Fractions (with Wilson intervals) of the scored weights, per definition; the top-level
    interpretable / robust figures are the ``ours`` row's."""
    scored = [r for r in records if r["total_kl"] > 1e-12]
    n = len(scored)
    rows = {}
    for d in definitions:
        k_i = sum(r["defs"][d.name]["interpretable"] for r in scored)
        k_r = sum(r["defs"][d.name]["robust"] for r in scored)
        rows[d.name] = {"label": d.label, "max_atoms": d.max_atoms, "max_coverage": d.max_coverage,
                        "slice_gate": d.slice_gate, "weights_scored": n, "interpretable": k_i, "robust": k_r,
                        "interpretable_fraction": k_i / n if n else None, "interpretable_ci": wilson(k_i, n),
                        "robust_fraction": k_r / n if n else None, "robust_ci": wilson(k_r, n)}
    ours = rows[definitions[0].name]
    slice_mat = [r["defs"][definitions[0].name].get("slice_scores") for r in scored]
    slice_mat = [s for s in slice_mat if s and all(v is not None for v in s)]
    heldout = [r["defs"][definitions[0].name].get("heldout_score") for r in scored]
    heldout = [h for h in heldout if h is not None]
    return {"weights_sampled": len(records), "weights_scored": n,
            **{k: ours[k] for k in ("interpretable_fraction", "interpretable_ci", "robust_fraction", "robust_ci")},
            "reliability": reliability(np.array(slice_mat)) if len(slice_mat) >= 2 else None,
            "mean_heldout_score": float(np.mean(heldout)) if heldout else None, "definitions": rows}


def load_records(out) -> list[dict]:
    """The finished records in out/weights.jsonl whatever its settings (for a progress report)."""
    path = Path(out) / "weights.jsonl"
    if not path.exists():
        return []
    recs = []
    for line in path.read_text().splitlines()[1:]:
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return recs


def _load(path: Path, settings: dict) -> list[dict]:
    """Finished records of a run with these settings (a run with other settings is set aside)."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    try:
        head = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        head = None
    if not head or head.get("settings") != settings:
        path.rename(path.with_suffix(f".stale-{time.time_ns()}.jsonl"))
        return []
    out = []
    for line in lines[1:]:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:      # a line cut by a kill: that weight is redone
            break
    return out


def explain_all(model, search: np.ndarray, slices: list[np.ndarray], out, sample: int, seed: int = 0,
                settings: dict | None = None, definitions=DEFINITIONS, progress: bool = True,
                label: str = "model", budget_s: float | None = None, max_weights: int | None = None,
                candidates: int = 5) -> tuple[list[dict], bool]:
    """Explain `sample` weights of `model` under every definition, appending each finished weight to
    out/weights.jsonl (resumed by a rerun with the same settings). budget_s / max_weights: stop
    (resumably) once this many seconds have passed / this many more weights are done (checked
    between chunks of CHUNK weights). candidates: the grammar's best predicates re-scored exactly
    per search. Returns (records in that order, finished)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # the model's exact weights belong to the settings: records of another training are set aside
    settings = {**(settings or {}), "sample": sample, "seed": seed, "threshold": THRESHOLD, "candidates": candidates,
                "order": "permuted", "definitions": [d.__dict__ for d in definitions],
                "model_sha256": model_sha256(model)}
    path = out / "weights.jsonl"
    done = _load(path, settings)
    model.eval()
    weights = sample_weights(model, sample, None, seed)          # sorted by matrix: explained in a seeded
    weights = [weights[i] for i in np.random.default_rng([seed, 43]).permutation(len(weights))]   # random order,
    # so that a run stopped part way has explained a uniform subsample, not the first matrices
    if any((r["param"], tuple(r["index"])) != (w[0], tuple(w[1])) for r, w in zip(done, weights)):
        path.rename(path.with_suffix(f".stale-{time.time_ns()}.jsonl"))      # another model's records: kept aside
        done = []
    if not path.exists():
        path.write_text(json.dumps({"settings": settings}) + "\n")
    else:                                  # drop a cut last line before appending
        path.write_text("\n".join([json.dumps({"settings": settings})] + [json.dumps(r) for r in done]) + "\n")
    t0 = time.perf_counter()
    search_t = torch.as_tensor(search, dtype=torch.long)
    search_scorer = Scorer(model, search_t)
    slice_scorers = [Scorer(model, torch.as_tensor(s, dtype=torch.long)) for s in slices]
    params = dict(model.named_parameters())
    records = list(done)
    bar = tqdm(total=len(weights), initial=len(done), disable=not progress, desc=f"explain {label}", unit="w")
    with path.open("a") as fh:
        for lo in range(len(done), len(weights), CHUNK):
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                break
            if max_weights is not None and len(records) - len(done) >= max_weights:
                break
            chunk = weights[lo:lo + CHUNK]
            chosen = {}
            for name, index in chunk:
                chosen.setdefault(name, torch.zeros(params[name].shape, dtype=torch.bool))[index] = True
            scanned = scan(model, search_t, params=sorted(chosen), weights=chosen, keep_positions=True, progress=False)
            for name, index in chunk:
                kl = scanned.position_kl(name, index).reshape(search_t.shape)
                rec = explain_weight(name, index, kl, search, search_scorer, slice_scorers, definitions,
                                     candidates=candidates)
                records.append(rec)
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                bar.update(1)
    bar.close()
    return records, len(records) == len(weights)


def to_explanations(records: list[dict], definition: str = "ours") -> list[dict]:
    """Records in the shape of wtc.explain's explanations.json (one definition's choice), for its report."""
    out = []
    for r in records:
        d = r["defs"].get(definition, {})
        out.append({"param": r["param"], "index": r["index"], "total_kl": r["total_kl"],
                    "predicate": d.get("predicate"), "source": d.get("source"), "proposer": "grammar",
                    "coverage": d.get("coverage"), "search_score": d.get("search_score"),
                    "heldout_score": d.get("heldout_score"), "slice_scores": d.get("slice_scores", []),
                    "interpretable": bool(d.get("interpretable")), "robust": bool(d.get("robust")),
                    "examples": r.get("examples", []), "note": r.get("note", d.get("note", ""))})
    return out


__all__ = ["DEFINITIONS", "Definition", "THRESHOLD", "explain_all", "explain_weight", "load_records", "summarise",
           "to_explanations", "wilson"]
