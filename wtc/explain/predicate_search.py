"""Beam search over the predicate grammar (wtc.explain.predicates) for one weight's per-position KL.

Search objective (cheap: additive in the KL, no model). With K = kl.sum() and F the truth array,
    covered(f)    = kl[F].sum() / K                share of the KL mass on f-true positions
    coverage p(f) = F.mean()                       share of positions where f holds
    objective     = covered + lam * ln(max_coverage / p) - atom_cost * (number of atoms - 1)
feasible only when 0 < p(f) <= max_coverage (the gate). The exact score (wtc.explain.explainer,
conditional zero-ablation) is min(R, 1 - I), which under an additive approximation of the KL is
`covered`; covered alone is maximised by the loosest predicate the gate allows, hence two small
terms. The specificity term lam * ln(max_coverage / p) (>= 0 under the gate; lam default 0.02)
is scale-free: narrowing f to a fraction r of its positions earns lam * ln(1 / r) whether f is
common or rare, so `tok[-1] is digit AND tok[0] == '.'` beats `tok[0] == '.'` when the KL sits on
the digit-dot positions, however rare dots are; at the margin a group of positions is worth
adding to f when its mean KL exceeds lam / covered (about 2%) of the mean KL on f. (A linear
penalty lam * p would let the precision of rare predicates go almost free.) atom_cost (default
0.002) is an Occam term: an added atom must earn its place, so atoms that only trim a few low-KL
positions by chance (fitting noise; with lam, trimming a share r earns about lam * r) do not win
over the plain predicate. The results keep only predicates with lift = covered - p(f) > min_lift
(default 0: the KL is denser where f holds than over all positions) and skip a candidate whose
truth array has Jaccard similarity >= `similar` (default 0.9) with a better result, so the few
candidates returned differ. Figures reported with each result: objective, covered, coverage, lift,
and precision / recall against the importance positions (the smallest set of positions holding
`mass` of the KL): precision = share of f-true positions that are importance positions,
recall = share of importance positions where f holds.
"""
from __future__ import annotations

import numpy as np

from wtc.explain.predicates import OPS, Atom, Predicate, atoms, check_tokens, features
from wtc.errors import ArgumentError

BLOCK = 8192          # positions per float32 product block in `search` (bounds its memory)

__all__ = ["search", "importance_mask"]


def importance_mask(kl: np.ndarray, mass: float = 0.9) -> np.ndarray:
    """The smallest set of positions of the whole (n, T) array holding `mass` of its total KL
    (positions taken by decreasing KL, ties toward the lower flat index, the rule of
    wtc.scan.kl.importance_positions for one row), as a bool array."""
    flat = np.clip(np.asarray(kl, np.float64).ravel(), 0, None)
    out = np.zeros(flat.shape, bool)
    total = flat.sum()
    if total > 0:
        order = np.lexsort((np.arange(flat.size), -flat))
        k = int(np.searchsorted(np.cumsum(flat[order]), mass * total * (1 - 1e-12))) + 1
        out[order[:min(k, flat.size)]] = True
    return out.reshape(np.shape(kl))


def _objective(covered, p, n_atoms, lam: float, atom_cost: float, max_coverage: float):
    """The search objective (module docstring); p > 0 (array or scalar)."""
    return covered + lam * np.log(max_coverage / p) - atom_cost * (n_atoms - 1)


def _figures(pred: Predicate, F: np.ndarray, kl: np.ndarray, imp: np.ndarray, lam: float,
             atom_cost: float, max_coverage: float) -> dict:
    total = kl.sum()
    covered = float(kl[F].sum() / total)
    p = float(F.mean())
    hits = int((F & imp).sum())
    return {"objective": float(_objective(covered, p, len(pred.atoms), lam, atom_cost, max_coverage)),
            "covered": covered, "coverage": p, "lift": covered - p,
            "precision": hits / max(int(F.sum()), 1), "recall": hits / max(int(imp.sum()), 1)}


def search(tokens, kl, mass: float = 0.9, beam: int = 10, max_atoms: int = 3, max_coverage: float = 0.5,
           top: int = 5, lam: float = 0.02, atom_cost: float = 0.002, similar: float = 0.9,
           min_lift: float = 0.0, library: list[Atom] | None = None, max_offset: int = 4,
           ngram_top: int = 200) -> list[tuple[Predicate, dict]]:
    """Beam search over compositions of atoms for the predicates on which `kl` concentrates.

    tokens (n, T) bytes; kl (n, T) >= 0 (the weight's per-position KL; tiny negative values are
    clipped to 0). Level 1: every atom and its negation. Each next level extends every beam member
    by AND / OR / AND NOT with every atom not already in it. Candidates are ranked by the objective
    (module docstring); only gated ones (0 < p(f) <= max_coverage) enter the beam and the results.
    Candidates with the same truth array count once (the first found: fewer atoms, library order).
    Returns up to `top` (Predicate, figures) pairs, best first (objective, then smaller coverage,
    then fewer atoms), each with lift = covered - coverage > min_lift (the KL is denser where f
    holds than on average) and none with Jaccard similarity >= `similar` to a better one.
    figures: objective, covered, coverage, lift, precision, recall (module docstring).
    `library` (from `atoms`, or wtc.explain.token_predicates.token_atoms for token ids) replaces the
    default library built from `tokens`."""
    tok = library[0].check(tokens) if library else check_tokens(tokens)     # token ids for token-string atoms
    kl = np.asarray(kl, dtype=np.float64)
    if kl.shape != tok.shape:
        raise ArgumentError(f"kl must have the shape of tokens {tok.shape}, got {kl.shape}")
    if not np.isfinite(kl).all():
        raise ArgumentError(f"kl holds a non-finite value at index {tuple(np.argwhere(~np.isfinite(kl))[0])}")
    kl = np.clip(kl, 0, None)
    if kl.sum() <= 0:
        raise ArgumentError("kl sums to 0: the weight has no effect to explain")
    if not 0 < max_coverage <= 1 or not 0 < mass <= 1:
        raise ArgumentError(f"need 0 < max_coverage <= 1 and 0 < mass <= 1, got {max_coverage}, {mass}")
    if lam < 0 or atom_cost < 0 or not 0 < similar <= 1:
        raise ArgumentError(f"need lam >= 0, atom_cost >= 0 and 0 < similar <= 1, "
                         f"got {lam}, {atom_cost}, {similar}")
    if beam < 1 or top < 1 or max_atoms < 1:
        raise ArgumentError(f"beam, top and max_atoms must be >= 1, got {beam}, {top}, {max_atoms}")
    lib = list(library) if library is not None else atoms(tok, max_offset=max_offset, ngram_top=ngram_top)
    feats = features(tok) if any(a.structural for a in lib) else None
    N = tok.size
    total = kl.sum()

    # atom truth arrays, constant ones and duplicates dropped (first kept)
    seen: set[bytes] = set()
    keep, rows = [], []
    for a in lib:
        F = a.evaluate(tok, feats).ravel()
        s = int(F.sum())
        key = np.packbits(F).tobytes()
        if 0 < s < N and key not in seen:
            seen.add(key)
            keep.append(a)
            rows.append(F)
    if not keep:
        return []
    M = np.stack(rows)                                           # (A, N) bool: candidate arrays
    MT = np.ascontiguousarray(M.T)                               # (N, A) bool: row gathers
    A = len(keep)
    where = {a: i for i, a in enumerate(keep)}
    w = (kl.ravel() / total).astype(np.float32)                  # KL share per position

    def restricted(F: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """For every atom a: (share of KL on a & F, count of a & F), F = all positions when None;
        only F's positions are read (float32 products in blocks of positions)."""
        idx = np.flatnonzero(F) if F is not None else None
        n_pos = N if idx is None else idx.size
        cov = np.zeros(A, np.float32)
        cnt = np.zeros(A, np.int64)
        for s in range(0, n_pos, BLOCK):
            sel = slice(s, min(s + BLOCK, n_pos)) if idx is None else idx[s:s + BLOCK]
            sub = MT[sel]
            cov += w[sel] @ sub.astype(np.float32)
            cnt += sub.sum(0)
        return cov, cnt

    kl_flat = kl.ravel()
    pool: dict[bytes, tuple] = {}      # truth key -> (pred, F, order found): every materialised candidate

    def consider(pred: Predicate, F: np.ndarray) -> bool:
        key = np.packbits(F).tobytes()
        if key in pool:
            return False
        pool[key] = (pred, F, len(pool))
        return True

    def exact(pred: Predicate, F: np.ndarray) -> tuple[float, float]:
        p = float(F.mean())
        covered = kl_flat[F].sum() / total
        return float(_objective(covered, p, len(pred.atoms), lam, atom_cost, max_coverage)), p

    def gated(count: np.ndarray) -> np.ndarray:
        return (count > 0) & (count <= max_coverage * N)

    def pick(covs: np.ndarray, counts: np.ndarray, n_atoms: int, make) -> list[tuple[Predicate, np.ndarray]]:
        """Best gated candidates by approximate (float32) objective, materialised, deduplicated,
        ranked exactly."""
        flat_c = counts.ravel()
        ok = np.flatnonzero(gated(flat_c))
        if ok.size == 0:
            return []
        flat_s = np.full(flat_c.shape, -np.inf)
        flat_s[ok] = _objective(covs.ravel()[ok].astype(np.float64), flat_c[ok] / N, n_atoms,
                                lam, atom_cost, max_coverage)
        want = min(ok.size, 4 * beam + top)
        cand = ok[np.lexsort((ok, flat_c[ok], -flat_s[ok]))][:want]
        found = []
        for idx in cand:
            pred, F = make(int(idx))
            if consider(pred, F):
                found.append((pred, F))
        found.sort(key=lambda pf: (-round(exact(*pf)[0], 12), exact(*pf)[1], len(pf[0].atoms)))
        return found[:beam]

    # level 1: atoms and their negations
    cov_all, cnt_all = restricted(None)
    cov1 = np.stack([cov_all, 1 - cov_all], 1)                   # [atom, NOT atom]
    cnt1 = np.stack([cnt_all, N - cnt_all], 1)

    def make1(idx: int):
        i, neg = divmod(idx, 2)
        F = ~M[i] if neg else M[i].copy()
        return Predicate((keep[i],), ("NOT",) if neg else ("",)), F

    beam_now = pick(cov1, cnt1, 1, make1)
    for _level in range(1, max_atoms):
        if not beam_now:
            break
        # per beam member B and atom a: a & B from B's positions; a | B and B & ~a follow from it
        cov = np.empty((A, len(beam_now), 3), np.float32)            # AND, OR, AND NOT
        cnt = np.empty((A, len(beam_now), 3), np.int64)
        for b, (pred, F) in enumerate(beam_now):
            c_and, n_and = restricted(F)
            cb, nb = w[F].sum(), int(F.sum())
            cov[:, b] = np.stack([c_and, cb + cov_all - c_and, cb - c_and], 1)
            cnt[:, b] = np.stack([n_and, nb + cnt_all - n_and, nb - n_and], 1)
            for a in pred.atoms:                                         # no atom twice
                cnt[where[a], b, :] = -1
        members = list(beam_now)

        def make(idx: int, members=members):
            i, rest = divmod(idx, len(members) * 3)
            b, o = divmod(rest, 3)
            pred, F = members[b]
            G = F & M[i] if o == 0 else F | M[i] if o == 1 else F & ~M[i]
            return Predicate(pred.atoms + (keep[i],), pred.ops + (OPS[o],)), G

        beam_now = pick(cov, cnt, _level + 1, make)

    ranked = []
    for pred, F, ct in pool.values():
        obj, p = exact(pred, F)
        if 0 < p <= max_coverage and kl_flat[F].sum() / total - p > min_lift:
            ranked.append((-round(obj, 12), p, len(pred.atoms), ct, pred, F))
    ranked.sort(key=lambda r: r[:4])
    imp = importance_mask(kl, mass).ravel()
    out: list[tuple[Predicate, dict]] = []
    chosen: list[np.ndarray] = []
    for r in ranked:
        F = r[5]
        if any((F & G).sum() >= similar * (F | G).sum() for G in chosen):
            continue
        chosen.append(F)
        out.append((r[4], _figures(r[4], F, kl_flat, imp, lam, atom_cost, max_coverage)))
        if len(out) == top:
            break
    return out
