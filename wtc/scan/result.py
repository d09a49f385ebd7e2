"""ScanResult: what a per-weight scan found, backed by its store."""
from __future__ import annotations

import numpy as np
import torch

from wtc.errors import IndexOutOfRange, ScanError, ScanUnavailable, UnknownName
from wtc.scan.kl import importance_positions as _importance
from wtc.scan.names import resolve


class _Totals(dict):
    """total_kl: keyed by the full parameter names; a wrapped model's own spelling finds them too."""

    def __init__(self, items, prefix: str, aliases: dict[str, str] | None = None):
        super().__init__(items)
        self.prefix, self.aliases = prefix, aliases or {}

    def __missing__(self, name):
        if not isinstance(name, str):
            raise KeyError(name)
        return self[resolve(name, list(self), self.prefix, what="total_kl key", aliases=self.aliases)]


class ScanResult:
    """total_kl[name]: tensor shaped like the parameter, sum over positions of KL(clean || zeroed)
    (0 for weights that are already zero); position_kl(name, index) the exact per-position KL;
    importance_positions(name, index, mass) the smallest set of positions holding `mass` of it."""

    def __init__(self, store, shapes: dict[str, tuple[int, ...]], n_positions: int, seconds: float,
                 weights_scanned: int, recompute=None, prefix: str = "", aliases: dict[str, str] | None = None):
        self.store, self.shapes, self.n_positions = store, shapes, n_positions
        self.seconds, self.weights_scanned = seconds, weights_scanned
        self._recompute = recompute
        self._prefix = prefix       # a wrapper's 'child.' (wtc.scan.names): names may be given without it
        self.mass = store.meta().get("mass", 0.9)
        self._aliases = aliases or {}  # other names of the scanned parameters (a bridge's TransformerLens names)
        self.total_kl = _Totals({n: torch.from_numpy(store.totals(n, s)) for n, s in shapes.items()}, prefix,
                                self._aliases)
        self.screen = None          # scan(..., screen=K): the screen's estimate and how it compares (wtc.scan.screened)

    def _name(self, name: str) -> str:
        if not isinstance(name, str):
            raise UnknownName(f"a parameter name is a str, got {type(name).__name__} {name!r}")
        for alias in (name, self._prefix + name):
            if self._aliases.get(alias) in self.shapes:
                return self._aliases[alias]
        if name not in self.shapes and not (self._prefix and self._prefix + name in self.shapes):
            raise UnknownName(f"{name!r} was not scanned; scanned: {', '.join(self.shapes)}")
        return name if name in self.shapes else self._prefix + name

    def _flat(self, name: str, index) -> int:
        """A weight's flat index from a flat int or a full index tuple, range-checked."""
        shape = self.shapes[self._name(name)]
        if isinstance(index, (bool, np.bool_)):
            raise ScanError(f"index must be a flat int or a tuple of ints, got {index!r}")
        if isinstance(index, (int, np.integer)):
            if not 0 <= index < int(np.prod(shape)):
                raise IndexOutOfRange(f"flat index {index} out of range for {name} {shape}")
            return int(index)
        if not isinstance(index, (tuple, list)) or not all(isinstance(i, (int, np.integer)) and
                                                           not isinstance(i, (bool, np.bool_)) for i in index):
            raise ScanError(f"index must be a flat int or a tuple of ints, got {index!r}")
        index = tuple(int(i) for i in index)
        if len(index) != len(shape) or any(not 0 <= i < s for i, s in zip(index, shape)):
            raise IndexOutOfRange(f"index {index} out of range for {name} {shape}")
        return int(np.ravel_multi_index(index, shape))

    def position_kl(self, name: str, index) -> torch.Tensor:
        """Per-position KL (N,) float64 of zeroing weight `index` (a tuple, or a flat int)."""
        flat, name = self._flat(name, index), self._name(name)
        row = self.store.weight(name, flat)
        if row is None:
            if float(self.total_kl[name].flatten()[flat]) == 0.0 and self._recompute is None:
                return torch.zeros(self.n_positions, dtype=torch.float64)
        elif row[2] is not None:
            return torch.from_numpy(row[2].astype(np.float64))
        if self._recompute is None:
            raise ScanUnavailable(f"{name}{list(np.unravel_index(flat, self.shapes[name]))}: per-position KL was "
                               "not kept in the store and this result has no model to recompute it from")
        return self._recompute(name, flat)

    def importance_positions(self, name: str, index, mass: float | None = None) -> np.ndarray:
        """Positions (flat over B*T, largest KL first) holding >= mass of the weight's total KL."""
        flat, name = self._flat(name, index), self._name(name)
        if mass is None or mass == self.mass:
            row = self.store.weight(name, flat)
            if row is not None:
                return row[1].copy()
        return _importance(self.position_kl(name, flat)[None].float(), self.mass if mass is None else mass)[0]

    def top(self, k: int = 10) -> list[dict]:
        """The k weights with the largest total KL."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ScanError(f"k must be a non-negative integer, got {k!r}")
        out = []
        for name, flat, total in self.store.top(k):
            row = {"param": name, "index": [int(i) for i in np.unravel_index(flat, self.shapes[name])],
                   "total_kl": total}
            also = self.alias_of(name)
            if also is not None:
                row["also_named"] = also
            out.append(row)
        return out

    def alias_of(self, name: str) -> str | None:
        """The name a user scanned `name` by, when it has another (a bridge parameter's TransformerLens
        name, the shortest of them); None otherwise. Indices stay those of `name`'s own layout (a
        bridge's W_Q is stored as the wrapped model's (d_model, d_model) q weight)."""
        others = [a for a, n in self._aliases.items() if n == name and a != name]
        return min(others, key=lambda a: (len(a), a)) if others else None

    def summary(self) -> dict:
        return {"weights_scanned": self.weights_scanned, "weights_in_store": self.store.count(),
                "positions": self.n_positions, "seconds": round(self.seconds, 3),
                "weights_per_second": self.weights_scanned / self.seconds if self.seconds > 0 else None,
                "top_weights": self.top(10),
                **({"screen": self.screen.summary()} if self.screen is not None else {})}
