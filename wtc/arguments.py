"""Checks for the arguments of public functions, shared by the Python API and the CLI: each returns
the value normalised (a numpy integer becomes an int) or raises the caller's error type with a
message naming the argument, the value and what was expected."""
from __future__ import annotations

import math
import numbers

from wtc.errors import ArgumentError

SEED_LIMIT = 2**63          # numpy and torch both take seeds in [0, 2**63)


def _error(error, name: str, value, what: str):
    return error(f"{name} must be {what}, got {value!r}")


def seed(value, name: str = "seed", error=ArgumentError) -> int:
    """A seed: an integer in [0, 2**63) (bools and floats refused, not rounded)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) < SEED_LIMIT:
        raise _error(error, name, value, "a seed (an integer in [0, 2**63))")
    return int(value)


def positive_int(value, name: str, error=ArgumentError, upper: int | None = None) -> int:
    """An integer >= 1 (and <= upper when given)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1 or \
            (upper is not None and int(value) > upper):
        raise _error(error, name, value, "a positive integer" + ("" if upper is None else f" <= {upper}"))
    return int(value)


def positive_seconds(value, name: str, error=ArgumentError) -> float:
    """A finite number of seconds > 0 (nan, inf, 0 and negatives never stop or never start)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise _error(error, name, value, "a finite positive number of seconds")
    return float(value)


def fraction(value, name: str, error=ArgumentError) -> float:
    """A number in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
        raise _error(error, name, value, "a number in (0, 1]")
    return float(value)


def float_readout(readout, out, error, what: str = "the readout"):
    """readout(out) for a user's readout: what it raises becomes `error` naming it (chained), and a
    result that is not a floating-point tensor is refused (a tuple or integer logits would fail
    obscurely later, or be scored after truncation)."""
    import torch

    try:
        y = readout(out)
    except error:
        raise
    except Exception as exc:
        raise error(f"{what} raised {type(exc).__name__}: {exc}") from exc
    if not torch.is_tensor(y) or not y.is_floating_point():
        got = f"a {y.dtype} tensor" if torch.is_tensor(y) else type(y).__name__
        raise error(f"{what} must return a floating-point tensor, got {got}")
    return y


class KnownFields:
    """Mixin for configuration dataclasses: an unknown keyword (a typo such as lerning_rate) is the
    class's own error (`_field_error`) naming it, the nearest fields and all of them, instead of
    Python's TypeError from the generated __init__."""

    _field_error = ArgumentError

    def __new__(cls, *args, **kwargs):
        import dataclasses

        if kwargs and dataclasses.is_dataclass(cls):
            names = [f.name for f in dataclasses.fields(cls) if f.init]
            no_unknown_keywords(f"{cls.__name__} has no field", kwargs, names, cls._field_error, "its fields are")
        return super().__new__(cls)


def no_unknown_keywords(what: str, given, known, error, listing: str = "it takes") -> None:
    """Raise `error` naming the keywords in `given` that are not in `known`, the nearest known names
    and all of them (a typo such as max_complexty), instead of Python's bare TypeError."""
    import difflib

    known = list(known)
    unknown = sorted(k for k in given if k not in known)
    if unknown:
        near = sorted({m for k in unknown for m in difflib.get_close_matches(k, known, n=2)})
        raise error(f"{what} {', '.join(map(repr, unknown))}{f' (did you mean {near}?)' if near else ''}; "
                    f"{listing}: {', '.join(known)}")



def real_array(x, name: str, error=ArgumentError):
    """x (a numpy array, torch tensor of any float dtype, bfloat16 included, nested lists) as a
    float64 numpy array; complex, ragged and non-numeric input is refused by `error` naming `name`
    (numpy would drop an imaginary part with a warning, or fail with its own message)."""
    import sys

    import numpy as np

    from wtc.tasks.limits import without_bfloat16

    x = without_bfloat16(x)
    torch = sys.modules.get("torch")       # no torch import here: a tensor means torch is loaded
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = x.resolve_conj().numpy() if x.is_complex() else x.numpy()
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise error(f"{name} is not a numeric array: {exc}") from None
    if np.iscomplexobj(a):
        raise error(f"{name} is complex; real numbers are expected")
    try:
        return a.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise error(f"{name} is not a numeric array ({a.dtype}): {exc}") from None
