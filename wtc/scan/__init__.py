"""Per-weight ablation scans: for every nonzero weight, the exact per-position KL(clean || zeroed).

    engine     scan(): batching, resume, the generic / structured / closed-form paths
    suffix     wtc Transformers: a zeroed weight's change computed from cached clean activations
    kl         KL rows (native CPU, Triton on CUDA, torch reference), importance positions
    store      the resumable SQLite store; result: ScanResult
    fisher     1/2 w^2 F_ii estimates for pre-filtering; reference: the naive zero-forward-restore loop
    screening  screen(): every weight's estimated total KL at once (batched, resumable, sharded);
               screen_estimators its math; screened: scan(..., screen=K), the screen checked exactly
    names      which parameters a name / pattern means (bridge_names: TransformerLens and bridge names)
    sources    what `wtc scan` reads: wtc checkpoints, Hugging Face directories, ids or text; torchrun
"""
from wtc.scan.engine import scan
from wtc.scan.fisher import fisher_estimate
from wtc.scan.kl import importance_positions, kl_rows, kl_unembed
from wtc.scan.result import ScanResult
from wtc.scan.screening import screen

__all__ = ["scan", "screen", "fisher_estimate", "ScanResult", "kl_rows", "kl_unembed", "importance_positions"]
