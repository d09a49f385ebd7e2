"""Numeric limits every task obeys (wtc.tasks.task for callables, wtc.tasks.data for records), and
the one conversion of user data to plain numbers (also used by Program, wtc.sr and wtc.arguments)."""

# Inputs and targets are trained on in float32 (max 3.4e38); past this magnitude normalisation
# statistics and float32 copies overflow into a NaN model, so such values are refused up front.
MAX_MAGNITUDE = 1e30
REAL_TOLERANCE = 1e-3
"""A real task is solved when max |pred - y| / (1 + |y|) stays within this (the suite's tolerance)."""


def without_bfloat16(a):
    """A torch tensor as a plain CPU tensor numpy can read: detached (recorded data or a target is
    a value, not a graph; numpy refuses a tensor that requires grad), on the CPU, and bfloat16 as
    float32 (exact; numpy has no bfloat16); anything else as it is. torch is not imported here
    (import wtc loads no torch)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        a = a.detach().cpu()
        return a.float() if a.dtype == torch.bfloat16 else a
    return a


def plain_numbers(a, what: str, error):
    """`a` (array, tensor, nested lists) converted as without_bfloat16 does, after refusing what
    np.asarray(a, float64) would turn into numbers that are not the user's numbers: a masked array
    with masked entries (the values under the mask would be read), datetime64 / timedelta64 (epoch
    counts), and text or bytes ('1' -> 1.0, 'nan' -> nan). Raises `error` naming `what`."""
    import numpy as np

    a = without_bfloat16(a)
    if isinstance(a, np.ma.MaskedArray):
        if np.ma.getmaskarray(a).any():
            raise error(f"{what} is a masked array with masked entries (the values under the mask are not data); "
                        "pass a.filled(value) or drop the masked sequences")
        a = np.ma.getdata(a)
    kind = getattr(getattr(a, "dtype", None), "kind", None)
    if kind is None and isinstance(a, (list, tuple, str, bytes)):
        try:
            kind = np.asarray(a).dtype.kind
        except (TypeError, ValueError):            # ragged: the caller's own conversion names it
            return a
    if kind in ("M", "m"):
        raise error(f"{what} is not a numeric array: it holds dates or durations ({np.asarray(a).dtype}); "
                    "convert them to numbers yourself (e.g. seconds since a start)")
    if kind in ("U", "S") or (kind == "O" and any(isinstance(v, (str, bytes)) for v in np.asarray(a).flat)):
        raise error(f"{what} is not a numeric array: it holds text or bytes; convert them to numbers yourself")
    return a
