"""Single weights explained: predicates scored by exact conditional zero-ablation.

    explainer    explain(): sample weights, propose predicates, score them on held-out slices
    predicates   the built-in predicate grammar (token classes, n-grams, string state, ...) and beam search
    sandbox      AST-whitelist checks and time limits for predicates from external proposers
    proposer     a proposer's shell command run contained (scrubbed environment, own directory and
                 process group, resource limits; not a jail: it runs as the user)
    conditional  a weight zeroed only where a predicate holds (or only where it does not)
    corpus       the byte-level Python standard-library corpus the predicates read
    report       the `wtc explain` command's files (explanations.json, report.md)
"""
from wtc.explain.conditional import conditional_kl, zeroed_at
from wtc.explain.explainer import explain

__all__ = ["explain", "conditional_kl", "zeroed_at"]
