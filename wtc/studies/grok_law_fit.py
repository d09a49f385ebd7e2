"""Fits, plot and report of the grokking scaling law (wtc.studies.grok_law).

fit_all(omega, p, tau): ordinary least squares in log space,
- "joint": log tau = c + a log omega + b log p (a = exponent_omega, b = exponent_p),
- "product": log tau = c + s log(omega p) (s = exponent_product),
- "redundancy": log tau = c + a log omega + b' log R with R = (p - 1) / 2 (b' = exponent_redundancy),
- per modulus: log tau = c_p + a_p log omega (with >= 2 weight decays),
each exponent with a 95% two-sided t-interval from the OLS standard error (n - k degrees of freedom;
None when there are no residual degrees of freedom or the regressor does not vary).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from scipy import stats

from wtc import lapack
from wtc.errors import StudyError


def ols(X: np.ndarray, y: np.ndarray, level: float = 0.95) -> dict:
    """Coefficients of y ~ X (X includes the intercept column), their standard errors and
    `level` t-intervals, R^2, n. Standard errors / intervals are None without residual degrees
    of freedom; a rank-deficient X gives None coefficients."""
    X, y = np.asarray(X, float), np.asarray(y, float)
    n, k = X.shape
    if n < k or np.linalg.matrix_rank(X) < k:
        return {"coef": None, "se": None, "ci": None, "r2": None, "n": n, "dof": n - k}
    coef = lapack.lstsq(X, y)
    resid = y - X @ coef
    dof = n - k
    tss = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(resid @ resid) / tss if tss > 0 else None
    if dof == 0:
        return {"coef": coef.tolist(), "se": None, "ci": None, "r2": r2, "n": n, "dof": 0}
    s2 = float(resid @ resid) / dof
    se = np.sqrt(np.diag(s2 * np.linalg.inv(X.T @ X)))
    t = float(stats.t.ppf(0.5 + level / 2, dof))
    return {"coef": coef.tolist(), "se": se.tolist(), "ci": [[float(c - t * e), float(c + t * e)] for c, e in zip(coef, se)],
            "r2": r2, "n": n, "dof": dof}


def _pick(res: dict, i: int, name: str) -> dict:
    ok = res["coef"] is not None
    return {f"exponent_{name}": res["coef"][i] if ok else None,
            f"se_{name}": res["se"][i] if ok and res["se"] else None,
            f"ci_{name}": res["ci"][i] if ok and res["ci"] else None}


def fit_all(omega, p, tau) -> dict:
    """The fits of the module doc over runs (omega_i, p_i, tau_i), tau > 0."""
    w, m, t = (np.asarray(v, float) for v in (omega, p, tau))
    if len(t) and (t <= 0).any():
        raise StudyError("tau must be > 0 (a log-log fit)")
    n = len(t)
    out: dict = {"n": n}
    if n == 0:
        return out
    one, lw, lp, lt = np.ones(n), np.log(w), np.log(m), np.log(t)
    joint = ols(np.column_stack([one, lw, lp]), lt)
    out.update(_pick(joint, 1, "omega"), **_pick(joint, 2, "p"), r2_joint=joint["r2"], dof_joint=joint["dof"])
    prod = ols(np.column_stack([one, lw + lp]), lt)
    out.update(_pick(prod, 1, "product"), r2_product=prod["r2"],
               prefactor_product=math.exp(prod["coef"][0]) if prod["coef"] else None)
    red = ols(np.column_stack([one, lw, np.log((m - 1) / 2)]), lt)
    out.update(_pick(red, 2, "redundancy"))
    per = {}
    for pv in sorted(set(m.tolist())):
        sel = m == pv
        r = ols(np.column_stack([one[sel], lw[sel]]), lt[sel])
        per[str(int(pv))] = {"n": int(sel.sum()), **_pick(r, 1, "omega")}
    out["per_p"] = per
    return out


def _fmt(v, d=2) -> str:
    return "n/a" if v is None else f"{v:.{d}f}"


def _ci(c) -> str:
    return "n/a" if c is None else f"[{c[0]:.2f}, {c[1]:.2f}]"


def markdown(s: dict) -> str:
    cfg = s["config"]
    lines = ["# grok-law study", "",
             f"tau_grok vs weight decay omega and modulus p ({s['quantity_p']}); {s['grok_definition']}.", "",
             f"{s['n_runs']} runs, {s['n_grokked']} grokked within {cfg['max_steps']} updates"
             + (f"; censored (left out of the fits): {', '.join(s['censored'])}" if s["censored"] else "") + "; "
             f"{s['seconds']} s.", "",
             "| p | R | omega | seed | n_train | tau_mem | tau_grok | delay | updates trained |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in s["runs"]:
        lines.append(f"| {r['p']} | {r['redundancy']} | {r['weight_decay']:g} | {r['seed']} | {r['n_train']} | "
                     f"{r['mem_step']} | {r['grok_step']} | {r['delay']} | {r['steps_trained']} |")
    lines += ["", "Log-log OLS fits (95% t-intervals; the law predicts -1 for each exponent):", "",
              "| quantity | n | omega exponent | p exponent | (omega p) exponent | R exponent | R^2 joint |",
              "|---|---|---|---|---|---|---|"]
    for key, label in (("grok", "tau_grok"), ("delay", "tau_grok - tau_mem")):
        f = s["fit"].get(key, {})
        if not f.get("n"):
            lines.append(f"| {label} | 0 | | | | | |")
            continue
        lines.append(f"| {label} | {f['n']} | {_fmt(f['exponent_omega'])} {_ci(f['ci_omega'])} | "
                     f"{_fmt(f['exponent_p'])} {_ci(f['ci_p'])} | {_fmt(f['exponent_product'])} "
                     f"{_ci(f['ci_product'])} | {_fmt(f['exponent_redundancy'])} {_ci(f['ci_redundancy'])} | "
                     f"{_fmt(f['r2_joint'], 3)} |")
    per = s["fit"].get("grok", {}).get("per_p", {})
    if per:
        lines += ["", "tau_grok omega exponent per modulus: " + "; ".join(
            f"p = {k}: {_fmt(v['exponent_omega'])} {_ci(v['ci_omega'])} (n {v['n']})" for k, v in per.items())]
    lines += ["", "![grokking time vs omega and omega p](grok_law.png)"]
    return "\n".join(lines) + "\n"


def plot(path: Path, s: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in s["runs"] if r["grokked"] and r["grok_step"] > 0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    f = s["fit"].get("grok", {})
    moduli = sorted({r["p"] for r in s["runs"]})
    a = axes[0]
    for i, pv in enumerate(moduli):
        pts = sorted((r["weight_decay"], r["grok_step"]) for r in runs if r["p"] == pv)
        if pts:
            a.plot(*zip(*pts), "o", color=f"C{i}", label=f"p = {pv}")
        cen = [r["weight_decay"] for r in s["runs"] if r["p"] == pv and not r["grokked"]]
        if cen:
            a.plot(cen, [s["config"]["max_steps"]] * len(cen), "v", color=f"C{i}", mfc="none")
        per = f.get("per_p", {}).get(str(pv), {})
        if pts and per.get("exponent_omega") is not None:
            ws = np.array([x for x, _ in pts])
            lt = np.log([t for _, t in pts])
            c = float(np.mean(lt - per["exponent_omega"] * np.log(ws)))
            a.plot(ws, np.exp(c) * ws ** per["exponent_omega"], "-", color=f"C{i}", lw=0.8)
    a.set(xscale="log", yscale="log", xlabel="weight decay omega", ylabel="tau_grok (updates)",
          title="grokking step vs weight decay (open: censored)")
    if a.get_legend_handles_labels()[0]:
        a.legend(fontsize=8)
    b = axes[1]
    for i, pv in enumerate(moduli):
        pts = [(r["weight_decay"] * r["p"], r["grok_step"]) for r in runs if r["p"] == pv]
        if pts:
            b.plot(*zip(*pts), "o", color=f"C{i}", label=f"p = {pv}")
    if runs and f.get("exponent_product") is not None:
        xs = np.array(sorted(r["weight_decay"] * r["p"] for r in runs))
        b.plot(xs, f["prefactor_product"] * xs ** f["exponent_product"], "k-", lw=1,
               label=f"fit: slope {f['exponent_product']:.2f} {_ci(f['ci_product'])}")
        mid = float(np.exp(np.mean(np.log([r["grok_step"] * r["weight_decay"] * r["p"] for r in runs]))))
        b.plot(xs, mid / xs, "k:", lw=1, label="slope -1 (the law)")
    b.set(xscale="log", yscale="log", xlabel="omega * p", ylabel="tau_grok (updates)",
          title="tau_grok vs omega p")
    if b.get_legend_handles_labels()[0]:
        b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
