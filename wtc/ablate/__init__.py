"""Per-weight work: exact ablation scans (wtc.ablate.scan), conditional zero-ablation
(wtc.ablate.conditional), predicate explanations (wtc.ablate.explain, with the grammar in
wtc.ablate.predicates and the sandbox for untrusted sources in wtc.ablate.sandbox) and
weight-sparse training (wtc.ablate.sparse)."""
from wtc.ablate.conditional import conditional_kl, zeroed_at
from wtc.ablate.explain import explain
from wtc.ablate.fisher import fisher_estimate
from wtc.ablate.kl import importance_positions, kl_rows, kl_unembed
from wtc.ablate.result import ScanResult
from wtc.ablate.scan import scan

__all__ = ["scan", "fisher_estimate", "ScanResult", "kl_rows", "kl_unembed", "importance_positions",
           "conditional_kl", "zeroed_at", "explain"]
