"""Numeric limits every task obeys (wtc.tasks.task for callables, wtc.tasks.data for records)."""

# Inputs and targets are trained on in float32 (max 3.4e38); past this magnitude normalisation
# statistics and float32 copies overflow into a NaN model, so such values are refused up front.
MAX_MAGNITUDE = 1e30
REAL_TOLERANCE = 1e-3  # max |pred - y| / (1 + |y|) for real tasks (the suite's tolerance)


def without_bfloat16(a):
    """A torch bfloat16 tensor as float32 (exact; numpy has no bfloat16, so np.asarray fails on it);
    anything else as it is. torch is not imported here (import wtc loads no torch)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16:
        return a.detach().cpu().float()
    return a
