"""Studies built from wtc's tools (`wtc study NAME`).

Every study module has the same shape: a config dataclass `CONFIG` (with a `quick()` variant),
`run(config, out_dir, progress=True) -> summary dict` (writes summary.json, report.md and plots
under out_dir; a rerun resumes), `HEADLINE` (the summary keys the CLI prints; dotted paths reach
into nested objects and lists) and `OUTPUTS` (the files written). The registry below is read
without importing the studies (they load torch).
"""
from __future__ import annotations

import importlib

from wtc.errors import StudyError

# name -> (module, one-line description)
STUDIES = {
    "markov": ("wtc.studies.markov", "ACE on a 4-state Markov chain, 3 seeds (--quick about 30 s on 2 cores)"),
    "modadd": ("wtc.studies.modadd", "modular addition p=53: grokking and the core through training, a weight-decay-0 "
                                     "branch (--quick about 6 min)"),
    "grok-law": ("wtc.studies.grok_law", "the grokking scaling law tau_grok ~ 1/(omega p): modular addition over weight "
                                         "decays x moduli, log-log exponents with CIs (full about 40 min, --quick about 20, on 2 busy cores)"),
    "core-inflation": ("wtc.studies.core_inflation", "modular addition trained on under weight decay: energy, sufficient "
                                                     "and necessary core ranks at log-spaced updates (resumable in pieces; --quick "
                                                     "6000 updates, about 30 min)"),
    "assign-add": ("wtc.studies.assign_add", "variable binding + addition mod 59: routing, Fourier, sweeps "
                                             "(--quick about 23 min)"),
    "sparse-vs-dense": ("wtc.studies.sparse_dense", "weight-sparse vs dense byte LMs on the stdlib and two controls "
                                                    "(untrained, shuffled text): share of weights explained by one "
                                                    "predicate under four definitions, with 95% intervals (--quick "
                                                    "roughly 40 min, estimated from its parts)"),
    "dt-dynamics": ("wtc.studies.dt_dynamics", "Discrete Transformer: the step where the loss converges vs the step "
                                               "where selections and attention turn hard, 12 tasks x 3 seeds "
                                               "(--quick about 3 min)"),
    "dt-control": ("wtc.studies.dt_control", "Discrete Transformer: the same tasks discovered under constraints (no "
                                             "MLPs, MLPs reading only the current input): where the program computes "
                                             "(--quick about 1 min)"),
    "agreement": ("wtc.studies.agreement", "ACE on language models: the 1-D number-agreement axis of small LMs trained "
                                           "on an agreement corpus, or of a local Hugging Face model (--model DIR)"),
}
"""Every study: name -> (its module, a one-line description with its --quick duration)."""


def names() -> list[str]:
    """The registered study names, in registry order (what `wtc study NAME` accepts)."""
    return list(STUDIES)


def load(name: str):
    """The study's module."""
    if name not in STUDIES:
        raise StudyError(f"unknown study {name!r} (available: {', '.join(STUDIES)})")
    return importlib.import_module(STUDIES[name][0])


def headline(summary: dict, keys) -> list[tuple[str, object]]:
    """(key, value) for each dotted key of the summary (None where the path does not exist)."""
    out = []
    for key in keys:
        v = summary
        for part in key.split("."):
            try:
                v = v[int(part)] if isinstance(v, list) else v[part]
            except (KeyError, IndexError, TypeError, ValueError):
                v = None
                break
        out.append((key, v))
    return out


__all__ = ["STUDIES", "headline", "load", "names"]
