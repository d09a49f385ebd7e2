"""ACE: algorithmic core extraction (activation x Jacobian balanced SVD), causal validation,
operator identification and cross-seed comparison."""
from wtc.ace.balanced import balanced_energy, balanced_svd, rank_for_energy
from wtc.ace.compare import cca, compare, principal_angles, projector_overlap, sequential_operator, shift_operator
from wtc.ace.core import Core, extract_core, keep_kl, patched, patched_accuracy, validate
from wtc.ace.gramians import GramianAccumulator

__all__ = ["extract_core", "validate", "keep_kl", "patched", "patched_accuracy", "Core", "compare", "cca", "principal_angles",
           "projector_overlap", "sequential_operator", "shift_operator", "balanced_svd", "balanced_energy", "rank_for_energy",
           "GramianAccumulator"]
