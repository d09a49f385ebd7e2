"""Per-weight ablation scans: exact per-position KL of zeroing each weight (wtc.ablate.scan)."""
from wtc.ablate.fisher import fisher_estimate
from wtc.ablate.kl import importance_positions, kl_rows, kl_unembed
from wtc.ablate.result import ScanResult
from wtc.ablate.scan import scan

__all__ = ["scan", "fisher_estimate", "ScanResult", "kl_rows", "kl_unembed", "importance_positions"]
