"""wtc.sr — symbolic regression (placeholder docstring, filled in later)."""
from wtc.sr.api import Fit, fit

__all__ = ["Fit", "fit"]
