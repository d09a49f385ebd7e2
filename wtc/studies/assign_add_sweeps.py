"""Assign-and-Add sweeps read as the authors' two panels (their generalisation grid): which accuracy
a panel is scored on, when a point has reached the level, the main run as a point of each panel, and
the threshold each panel brackets. The points themselves are trained by
wtc.studies.assign_add._sweep_point (cfg: an AssignAddStudy)."""
from __future__ import annotations

# the swept variable and the accuracy it is scored on; the other variable stays at the main run's
# value (theirs: r = 1 in the f panel, f = 0.7 in the r panel)
PANELS = {"f": "0var_heldout", "r": "2var_union"}


def panel_stop(metric: str, level: float):
    """The Eval stop predicate of a point: its panel's accuracy at or above the level."""
    return lambda point: point[metric] >= level


def main_points(curve: list[dict], cfg, union: dict) -> list[dict]:
    """The main run as a point of each panel, read off its own curve the way a sweep point is run
    (stopped at the level, or at sweep_steps), as long as the curve covers that far."""
    within = [c for c in curve if 0 < c["step"] <= cfg.sweep_steps]      # sweep points have no step-0 record
    if not within or within[-1]["step"] != min(cfg.sweep_steps, cfg.steps):
        return []
    pts = []
    for panel, metric in PANELS.items():
        reached = next((c["step"] for c in within if c[metric] >= cfg.sweep_level), None)
        if cfg.steps < cfg.sweep_steps and (reached is None or not cfg.sweep_stop):
            continue                               # shorter than a point would train, and not stopped by the level
        last = next((c for c in within if c["step"] == reached), within[-1]) if cfg.sweep_stop else within[-1]
        p = {"f": cfg.f, "r": cfg.r, "panel": panel, "metric": metric, "steps": cfg.sweep_steps,
             "stop": cfg.sweep_stop, "level": cfg.sweep_level, "steps_run": last["step"], "reached_at": reached,
             "main_run": True, **last}
        if panel == "r" and last["step"] == cfg.steps:
            p["acc_2var_union_exhaustive"] = union["acc_2var_union_exhaustive"]
        pts.append(p)
    return pts


def thresholds(sweeps: list[dict], cfg) -> dict:
    """Per panel: the values whose points reached sweep_level and those that did not, and the
    threshold bracket (largest value that failed below the smallest that succeeded). A value that
    failed above the smallest success (one seed's run stuck on a plateau the neighbours passed) is
    kept in failed_above, so a bracket never hides a panel that is not monotone."""
    out = {}
    for name in PANELS:
        pts = sorted((p[name], p["reached_at"] is not None) for p in sweeps if p.get("panel") == name)
        ok = [v for v, hit in pts if hit]
        low = min(ok) if ok else None
        below = [v for v, hit in pts if not hit and (low is None or v < low)]
        above = [v for v, hit in pts if not hit and low is not None and v > low]
        out[name] = {"metric": PANELS[name], "level": cfg.sweep_level, "reached": ok,
                     "not_reached": [v for v, hit in pts if not hit], "bracket": [max(below) if below else None, low],
                     "failed_above": above, "monotone": not above}
    return out
