"""What the Assign-and-Add model computes, measured on its own activations.

Every function takes the trained wtc Transformer (2 layers, 1 head, layer-2 MLP only) and token
batches from wtc.tasks.assign_add; positions: the prefix is 0-11, "+" 12, the two sides 13 and 14,
"=" 15 (where the answer is read).

- routing(): layer-1 previous-token rate (each prefix value's strongest layer-1 attention is on
  its own variable name, one position back) and layer-2 value routing (the two positions the "="
  query attends to most are exactly the two values it adds: a side's own position when it is a
  number, its assignment's value position when it is a variable).
- virtual_addition(): the layer-2 MLP fed with value-path vectors instead of a real sequence. The
  value-path vector of number n is what the layer-2 head writes per unit of attention on a prefix
  value token n: (W_E[n] + c) W_V W_O, with c the mean non-token part (position + layer-1 output)
  of the residual at prefix value positions. The MLP input for a pair (a, b) is the mean residual at
  "=" plus half of each (the head splits its attention over the two values); the accuracy of the
  head over all 59^2 pairs says whether the addition is in place for values routed from variables.
- fourier(): 2-D DFT over (n1, n2) of each layer-2 MLP neuron's pre-activation at "=" on the
  0-var grid; frequency k collects the coefficients (k1, k2) with k1, k2 in {0, k, -k} (the terms
  cos/sin of w a, w b, w (a + b), w (a - b) with w = 2 pi k / 59); a neuron is on frequency k when k
  holds more than half of its variance.
- twin_cosine(): cosine between the residual before the layer-2 MLP at "=" of a variable sequence
  and of its constant twin (the same sequence with the variables in the core replaced by their values).
"""
from __future__ import annotations

import numpy as np
import torch

from wtc.tasks.assign_add import ANSWER_POS, P, PREFIX, VAR0
from wtc.errors import StudyError

L1_PATTERN = "blocks.0.attn.hook_pattern"
L2_PATTERN = "blocks.1.attn.hook_pattern"
L2_RESID_PRE = "blocks.1.hook_resid_pre"
L2_RESID_MID = "blocks.1.hook_resid_mid"
L2_MLP_PRE = "blocks.1.mlp.hook_pre"


def value_positions(tokens: np.ndarray) -> np.ndarray:
    """(n, 16) bool: prefix positions holding an assigned value (the token after a variable)."""
    tokens = np.asarray(tokens)
    out = np.zeros(tokens.shape, bool)
    out[:, 1:PREFIX] = tokens[:, : PREFIX - 1] >= VAR0
    return out


def referenced_positions(tokens: np.ndarray) -> np.ndarray:
    """(n, 2) positions of the two values the "=" query needs: 13 / 14 for a number side, the
    assignment's value position for a variable side."""
    tokens = np.asarray(tokens)
    out = np.empty((len(tokens), 2), np.int64)
    for side, pos in enumerate((PREFIX + 1, PREFIX + 2)):
        tok = tokens[:, pos]
        is_var = tok >= VAR0
        match = (tokens[:, : PREFIX - 1] == tok[:, None]) & is_var[:, None]          # (n, 11)
        out[:, side] = np.where(is_var, match.argmax(1) + 1, pos)
    return out


def constant_twin(tokens: np.ndarray) -> np.ndarray:
    """The same sequences with each variable in the core replaced by its assigned value."""
    tokens = np.asarray(tokens).copy()
    ref = referenced_positions(tokens)
    rows = np.arange(len(tokens))
    for side, pos in enumerate((PREFIX + 1, PREFIX + 2)):
        tokens[:, pos] = tokens[rows, ref[:, side]]
    return tokens


@torch.no_grad()
def _cache(model, tokens, names):
    return model.run_with_cache(torch.as_tensor(tokens), names_filter=list(names))[1]


@torch.no_grad()
def routing(model, tokens: np.ndarray) -> dict:
    """l1_prev_token_rate and l2_value_routing_rate (see the module docstring) on `tokens`."""
    tokens = np.asarray(tokens)
    c = _cache(model, tokens, (L1_PATTERN, L2_PATTERN))
    p1 = c[L1_PATTERN][:, 0].numpy()                                  # (n, T, T), one head
    vals = value_positions(tokens)
    rows, cols = np.nonzero(vals)
    l1 = float((p1[rows, cols].argmax(-1) == cols - 1).mean()) if len(rows) else float("nan")
    p2 = c[L2_PATTERN][:, 0, ANSWER_POS].numpy()                      # (n, T)
    top2 = np.sort(np.argsort(-p2, axis=1)[:, :2], axis=1)
    ref = np.sort(referenced_positions(tokens), axis=1)
    exact = (top2 == ref).all(1)
    mass = np.take_along_axis(p2, ref, 1).sum(1)
    return {"l1_prev_token_rate": l1, "l2_value_routing_rate": float(exact.mean()),
            "l2_value_attention_mass": float(mass.mean())}


@torch.no_grad()
def value_vectors(model, tokens: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(59, D) value-path vectors of the numbers and the (D,) mean residual at "=" (before layer 2)."""
    tokens = np.asarray(tokens)
    resid = _cache(model, tokens, (L2_RESID_PRE,))[L2_RESID_PRE]      # (n, T, D)
    rows, cols = np.nonzero(value_positions(tokens))
    W_E = model.embed.W_E
    context = (resid[rows, cols] - W_E[torch.as_tensor(tokens[rows, cols])]).mean(0)   # (D,)
    attn = model.blocks[1].attn
    ov = ((W_E[:P] + context) @ attn.W_V[0] + attn.b_V[0]) @ attn.W_O[0]   # (59, D); b_O added once
    return ov, resid[:, ANSWER_POS].mean(0)


@torch.no_grad()
def virtual_addition(model, tokens: np.ndarray) -> float:
    """Accuracy over all 59^2 pairs of the layer-2 MLP and head fed r_eq + (v(a) + v(b)) / 2."""
    v, r_eq = value_vectors(model, tokens)
    a, b = torch.meshgrid(torch.arange(P), torch.arange(P), indexing="ij")
    mid = r_eq + 0.5 * (v[a.flatten()] + v[b.flatten()]) + model.blocks[1].attn.b_O     # (P*P, D)
    mlp = model.blocks[1].mlp
    logits = model.unembed(model.final_hidden(mid + mlp(mid)))
    return float((logits.argmax(-1) == (a.flatten() + b.flatten()) % P).float().mean())


def zero_var_grid(task, seed: int = 3) -> np.ndarray:
    """(59^2, 16) 0-var sequences, one per ordered pair (n1, n2) in row-major order."""
    pairs = np.stack(np.meshgrid(np.arange(P), np.arange(P), indexing="ij"), -1).reshape(-1, 2)
    every = np.arange(VAR0, VAR0 + 12)
    tokens, _ = task.build(np.random.default_rng(seed), pairs, np.zeros(len(pairs), np.int64), every, every)
    return tokens


@torch.no_grad()
def fourier(model, grid_tokens: np.ndarray, share: float = 0.5, key_min: float = 0.05) -> dict:
    """Per-neuron dominant frequency of the layer-2 MLP pre-activation over the (n1, n2) grid."""
    pre = _cache(model, grid_tokens, (L2_MLP_PRE,))[L2_MLP_PRE][:, ANSWER_POS]          # (P*P, M)
    return frequency_analysis(pre, share, key_min)


def frequency_analysis(pre: torch.Tensor, share: float = 0.5, key_min: float = 0.05) -> dict:
    """pre (P*P, M), rows in (n1, n2) row-major order: each neuron's share of variance per frequency
    k = 1..29; key frequencies: those holding at least `key_min` of the single-frequency neurons."""
    pre = torch.as_tensor(pre).double()
    if pre.ndim != 2 or pre.shape[0] != P * P:
        raise StudyError(f"pre-activations must be ({P * P}, neurons), got {tuple(pre.shape)}")
    M = pre.shape[1]
    G = pre.T.reshape(M, P, P)
    G = G - G.mean((1, 2), keepdim=True)
    power = torch.fft.fft2(G).abs().pow(2)                                                # (M, P, P)
    total = power.sum((1, 2))
    alive = total > 1e-12 * float(total.max().clamp_min(1e-300))
    k = torch.arange(P)
    fold = torch.minimum(k, P - k)                                     # frequency of each index
    # coefficient (k1, k2) belongs to frequency k when both folded indices are in {0, k}
    f1, f2 = fold[:, None].expand(P, P), fold[None, :].expand(P, P)
    shares = torch.stack([power[:, ((f1 == q) | (f1 == 0)) & ((f2 == q) | (f2 == 0)) & ((f1 + f2) > 0)].sum(1)
                          for q in range(1, P // 2 + 1)], 1) / total.clamp_min(1e-300)[:, None]    # (M, 29)
    best_share, best = shares.max(1)
    best = best + 1
    on = alive & (best_share > share)
    counts = {int(q): int(((best == q) & on).sum()) for q in range(1, P // 2 + 1)}
    n_on = int(on.sum())
    key = sorted(q for q, c in counts.items() if n_on and c >= max(2, key_min * n_on))
    on_key = int(sum(counts[q] for q in key))
    n_alive = int(alive.sum())
    return {"neurons": M, "alive": n_alive, "single_frequency": n_on,
            "single_frequency_fraction": n_on / max(n_alive, 1),
            "key_frequencies": key, "on_key_fraction": on_key / max(n_alive, 1),
            "frequency_counts": {q: c for q, c in counts.items() if c}}


def pad_grid() -> np.ndarray:
    """(59^2, 16) the authors' Fourier inputs: 12 PADs, then "+ n m =", rows in (n, m) row-major order."""
    from wtc.tasks.assign_add import EQUALS, PAD, PLUS
    n, m = np.meshgrid(np.arange(P), np.arange(P), indexing="ij")
    tokens = np.full((P * P, 16), PAD, np.int64)
    tokens[:, PREFIX], tokens[:, PREFIX + 1], tokens[:, PREFIX + 2], tokens[:, ANSWER_POS] = PLUS, n.ravel(), m.ravel(), EQUALS
    return tokens


def additive_fourier_fit(pre, r2_min: float = 0.9) -> dict:
    """pre (59^2, M) in (n, m) row-major order: per neuron and frequency k = 1..29 the least-squares
    fit of c + A cos(2 pi k n / 59 + alpha) + B cos(2 pi k m / 59 + beta) (the authors' additive
    form); each neuron's best k and its R^2. A neuron fits when R^2 >= r2_min."""
    pre = torch.as_tensor(pre).double()
    if pre.ndim != 2 or pre.shape[0] != P * P:
        raise StudyError(f"pre-activations must be ({P * P}, neurons), got {tuple(pre.shape)}")
    n, m = torch.meshgrid(torch.arange(P, dtype=torch.float64), torch.arange(P, dtype=torch.float64), indexing="ij")
    n, m = n.flatten(), m.flatten()
    y = pre - pre.mean(0, keepdim=True)
    total = y.pow(2).sum(0)
    alive = total > 1e-12 * float(total.max().clamp_min(1e-300))
    best_r2 = torch.full((pre.shape[1],), -1.0, dtype=torch.float64)
    best_k = torch.zeros(pre.shape[1], dtype=torch.long)
    amp_ratio = torch.zeros(pre.shape[1], dtype=torch.float64)
    for k in range(1, P // 2 + 1):
        w = 2 * np.pi * k / P
        X = torch.stack([torch.cos(w * n), torch.sin(w * n), torch.cos(w * m), torch.sin(w * m)], 1)  # orthogonal, mean 0
        coef = (X.T @ y) / X.pow(2).sum(0)[:, None]                                                  # (4, M)
        r2 = (coef.pow(2) * X.pow(2).sum(0)[:, None]).sum(0) / total.clamp_min(1e-300)
        better = r2 > best_r2
        best_r2 = torch.where(better, r2, best_r2)
        best_k = torch.where(better, torch.full_like(best_k, k), best_k)
        a, b = coef[:2].pow(2).sum(0).sqrt(), coef[2:].pow(2).sum(0).sqrt()
        amp_ratio = torch.where(better, torch.minimum(a, b) / torch.maximum(a, b).clamp_min(1e-300), amp_ratio)
    fits = alive & (best_r2 >= r2_min)
    counts = {int(q): int(((best_k == q) & fits).sum()) for q in range(1, P // 2 + 1)}
    return {"neurons": int(pre.shape[1]), "alive": int(alive.sum()), "r2_min": r2_min,
            "fit_fraction": float(fits.sum()) / max(int(alive.sum()), 1),
            "median_r2": float(best_r2[alive].quantile(0.5)) if alive.any() else None,
            "median_amplitude_ratio": float(amp_ratio[fits].quantile(0.5)) if fits.any() else None,
            "frequency_counts": {q: c for q, c in counts.items() if c},
            "top_frequencies": [q for q, _ in sorted(counts.items(), key=lambda t: -t[1])[:8] if counts[q]]}


@torch.no_grad()
def fourier_additive(model, r2_min: float = 0.9) -> dict:
    """additive_fourier_fit of the layer-2 MLP pre-activations at "=" on pad_grid()."""
    pre = _cache(model, pad_grid(), (L2_MLP_PRE,))[L2_MLP_PRE][:, ANSWER_POS]
    return additive_fourier_fit(pre, r2_min)


@torch.no_grad()
def qk_identity(model) -> dict:
    """The layer-2 QK pattern between variables seen through layer-1 OV: query q_i = W_E[v_i] OV1 (a
    side variable moved into "=" by layer 1), key k_j = W_E[v_j] OV1 (the variable moved into its
    value's position); S = (q W_Q2)(k W_K2)^T / sqrt(d_head) over the 12 variables. Identity: each
    row's maximum on the diagonal; margin: diagonal minus the row's largest other entry."""
    W_E = model.embed.W_E.double()
    a1, a2 = model.blocks[0].attn, model.blocks[1].attn
    ov1 = a1.W_V[0].double() @ a1.W_O[0].double()
    v = W_E[VAR0:VAR0 + 12] @ ov1
    S = (v @ a2.W_Q[0].double()) @ (v @ a2.W_K[0].double()).T / np.sqrt(a2.W_Q.shape[-1])
    diag = S.diagonal()
    off = S.masked_fill(torch.eye(12, dtype=torch.bool), float("-inf")).max(1).values
    return {"identity_rows": int((S.argmax(1) == torch.arange(12)).sum()), "variables": 12,
            "min_margin": float((diag - off).min()), "mean_margin": float((diag - off).mean()),
            "scores": S.tolist()}


@torch.no_grad()
def prev_token_qk(model) -> dict:
    """Layer-1 previous-token QK from the weights: a value token at prefix position t (query: the
    mean number embedding + W_pos[t]) against a variable at each earlier position s < t (key: the
    mean variable embedding + W_pos[s]) and against itself (its own number key); "previous token" at
    t when s = t - 1 scores highest. Also on positions alone (W_pos only, keys s <= t)."""
    a1 = model.blocks[0].attn
    pos = model.pos_embed.W_pos.double()
    W_E = model.embed.W_E.double()
    num, var = W_E[:P].mean(0), W_E[VAR0:VAR0 + 12].mean(0)
    Wq, Wk = a1.W_Q[0].double(), a1.W_K[0].double()
    T = torch.arange(1, PREFIX)
    tok_hits = pos_hits = 0
    for t in T.tolist():
        q = (num + pos[t]) @ Wq
        keys = torch.cat([(var + pos[:t]) @ Wk, ((num + pos[t]) @ Wk)[None]], 0)      # s = 0..t-1, then itself
        tok_hits += int(int((keys @ q).argmax()) == t - 1)
        sp = (pos[:t + 1] @ Wk) @ (pos[t] @ Wq)
        pos_hits += int(int(sp.argmax()) == t - 1)
    return {"prev_token_positions": tok_hits, "positions_only": pos_hits, "positions": int(len(T))}


@torch.no_grad()
def twin_cosine(model, tokens: np.ndarray) -> float:
    """Mean cosine between the pre-MLP residual at "=" of each sequence and of its constant twin."""
    tokens = np.asarray(tokens)
    twin = constant_twin(tokens)
    a = _cache(model, tokens, (L2_RESID_MID,))[L2_RESID_MID][:, ANSWER_POS]
    b = _cache(model, twin, (L2_RESID_MID,))[L2_RESID_MID][:, ANSWER_POS]
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).mean())


def phases(curves: list[dict], keys, window: int, jump: float) -> list[dict]:
    """Jumps in curves: intervals where a key rises by >= `jump` within `window` steps, merged when
    they overlap; each with its steepest step (largest rise over one evaluation interval)."""
    out = []
    steps = np.array([c["step"] for c in curves])
    for key in keys:
        y = np.array([c.get(key, np.nan) for c in curves], float)
        if len(y) < 2 or np.isnan(y).all():
            continue
        hot = np.zeros(len(y), bool)
        for i in range(len(y)):
            j = np.searchsorted(steps, steps[i] + window, side="right") - 1
            if j > i and np.nanmax(y[i:j + 1]) - y[i] >= jump:
                k = i + int(np.nanargmax(y[i:j + 1]))
                hot[i:k + 1] = True
        i = 0
        while i < len(y):
            if not hot[i]:
                i += 1
                continue
            j = i
            while j + 1 < len(y) and hot[j + 1]:
                j += 1
            end = min(j + 1, len(y) - 1)
            rise = np.diff(y[i:end + 1])
            steep = i + int(np.nanargmax(rise)) + 1 if len(rise) else end
            if y[end] - y[i] >= jump:
                out.append({"metric": key, "start_step": int(steps[i]), "end_step": int(steps[end]),
                            "steepest_step": int(steps[steep]), "before": float(y[i]), "after": float(y[end])})
            i = end + 1
    return sorted(out, key=lambda p: (p["start_step"], p["metric"]))


def weight_scan(model, tokens: np.ndarray, attention_sample: int = 512, seed: int = 0, top: int = 10) -> dict:
    """Per-weight scan at "=": for every nonzero weight, the total KL(clean || zeroed) over the "="
    positions of `tokens` (wtc.scan.engine with positions=). Every weight of the embeddings, the
    layer-2 MLP and the unembedding (fast paths); `attention_sample` weights drawn per attention
    matrix (a full forward of the rest of the network each), whose matrix totals are estimates
    (mean x count) and say so."""
    import time

    from wtc.scan import scan

    t0 = time.perf_counter()
    tokens = torch.as_tensor(tokens)
    counted = torch.zeros(tokens.shape, dtype=torch.bool)
    counted[:, ANSWER_POS] = True
    params = {n: p for n, p in model.named_parameters() if p.ndim >= 2 and not n.split(".")[-1].startswith("b_")}
    rng = np.random.default_rng([seed, 5])
    masks = {}
    for n, p in params.items():
        if ".attn.W_" in n:
            nz = torch.nonzero(p.detach().flatten() != 0).flatten().numpy()
            pick = rng.choice(nz, size=min(attention_sample, len(nz)), replace=False)
            m = torch.zeros(p.numel(), dtype=torch.bool)
            m[torch.from_numpy(pick)] = True
            masks[n] = m.reshape(p.shape)
    res = scan(model, tokens, params=sorted(params), weights=masks, positions=counted, progress=False,
               keep_positions=False)
    per, full_totals = {}, []
    for n, p in params.items():
        nonzero = int((p != 0).sum())
        kl = res.total_kl[n].flatten().double()
        scanned = int(masks[n].sum()) if n in masks else nonzero
        mean = float(kl.sum()) / max(scanned, 1)
        per[n] = {"weights": nonzero, "scanned": scanned, "kl_sum_scanned": float(kl.sum()),
                  "mean_kl": mean, "total_kl": mean * nonzero, "estimated": n in masks}
        if n not in masks:
            full_totals.append(kl[p.detach().flatten() != 0])
    grand = sum(v["total_kl"] for v in per.values())
    for v in per.values():
        v["share"] = v["total_kl"] / grand if grand > 0 else None
    allfull = torch.cat(full_totals).sort(descending=True).values
    cum = allfull.cumsum(0) / allfull.sum().clamp_min(1e-300)
    holding = int((cum < 0.9).sum()) + 1
    return {"sequences": int(tokens.shape[0]), "positions": "=", "per_matrix": per,
            "top": res.top(top), "fully_scanned_weights": int(len(allfull)),
            "fraction_holding_90pct": holding / max(len(allfull), 1),
            "seconds": round(time.perf_counter() - t0, 1)}


def transition(curve: list[dict], key: str) -> dict | None:
    """When a metric made its rise: the first steps at which it covered 10%, 50% and 90% of the
    way from its first value to its final value (None when it did not rise by at least 0.1)."""
    y = np.array([c[key] for c in curve], float)
    steps = [c["step"] for c in curve]
    lo, hi = y[0], y[-1]
    if hi - lo < 0.1:
        return None
    at = {f"t{int(q * 100)}": int(steps[int(np.argmax(y >= lo + q * (hi - lo)))]) for q in (0.1, 0.5, 0.9)}
    return {"metric": key, "from": float(lo), "to": float(hi), **at}


__all__ = ["pad_grid", "additive_fourier_fit", "fourier_additive", "qk_identity", "prev_token_qk", "weight_scan", "transition", "routing", "virtual_addition", "value_vectors", "fourier",
           "frequency_analysis", "twin_cosine", "phases", "zero_var_grid", "value_positions",
           "referenced_positions", "constant_twin"]
