"""Per-weight ablation scans: for every nonzero weight, the exact per-position KL(clean || zeroed).

    engine     scan(): batching, resume, the generic / structured / closed-form paths
    suffix     wtc Transformers: a zeroed weight's change computed from cached clean activations
    kl         KL rows (native CPU, Triton on CUDA, torch reference), importance positions
    store      the resumable SQLite store; result: ScanResult
    fisher     1/2 w^2 F_ii estimates for pre-filtering; reference: the naive zero-forward-restore loop
"""
from wtc.scan.engine import scan
from wtc.scan.fisher import fisher_estimate
from wtc.scan.kl import importance_positions, kl_rows, kl_unembed
from wtc.scan.result import ScanResult

__all__ = ["scan", "fisher_estimate", "ScanResult", "kl_rows", "kl_unembed", "importance_positions"]
