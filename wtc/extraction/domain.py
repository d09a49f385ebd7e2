"""The domain a program was read on: per input channel the values (or range) seen, the channel
count, the lengths. A program answers confidently on anything; only inside its domain was it
checked against the model and the task, so the Program and its standalone source check it.

    Domain.from_samples   recorded at extraction from the task's own draw
    Domain.violation      the first input outside it (vectorised; Program.__call__ raises or warns)
    domain_statements     DOMAIN = {...} and _check_domain(xs) for the standalone source (AST)
    to_dict / from_dict   plain JSON: the DOMAIN of the source and of saved programs
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass

import numpy as np

from wtc.errors import WtcError

MAX_VALUES = 64       # an integer channel with at most this many distinct values records the set


class DomainError(WtcError, ValueError):
    """A domain record (Domain.from_dict) is malformed."""


@dataclass(frozen=True)
class ChannelDomain:
    """One input channel: a finite set of values (`values`), or a range [low, high]; `integer`: its
    values are whole numbers (a range then admits whole numbers only)."""

    name: str
    values: tuple[float, ...] | None = None
    low: float | None = None
    high: float | None = None
    integer: bool = False

    def describe(self) -> str:
        if self.values is not None:
            return "one of " + ", ".join(_num(v) for v in self.values)
        kind = "whole numbers" if self.integer else "reals"
        return f"{kind} in [{_num(self.low)}, {_num(self.high)}]"

    def outside(self, v: np.ndarray) -> np.ndarray:
        """Mask of the values of `v` outside this channel's domain."""
        if self.values is not None:
            return ~np.isin(v, np.asarray(self.values))
        bad = (v < self.low) | (v > self.high)
        return bad | (v != np.round(v)) if self.integer else bad


@dataclass(frozen=True)
class Violation:
    """The first input outside a domain: a length, or a value (sequence, position, channel)."""

    message: str
    sequence: int | None = None
    position: int | None = None
    channel: str | None = None
    value: float | None = None


@dataclass(frozen=True)
class Domain:
    """What a program was verified on. `lengths`: the sequence lengths it was scored at (seq_len;
    also 2 * seq_len for an any_length task); with `any_length` every length is in the domain (the
    program is a loop over T), else only those."""

    channels: tuple[ChannelDomain, ...]
    lengths: tuple[int, ...]
    any_length: bool = False

    @property
    def n_inputs(self) -> int:
        return len(self.channels)

    @classmethod
    def from_samples(cls, x: np.ndarray, names: list[str], seq_len: int, any_length: bool) -> "Domain":
        """The domain of a draw x (n, T, n_inputs): integer channels with few values as their set,
        the rest as the range seen, rounded outward (a sample's extremes fall just inside its
        distribution's: a fresh draw from uniform(-1, 1) must not leave [-0.9999, 0.9998])."""
        channels = []
        for c, name in enumerate(names):
            v = np.asarray(x[:, :, c], dtype=np.float64).ravel()
            seen = np.unique(v)
            integer = bool(np.all(seen == np.round(seen)))
            if integer and len(seen) <= MAX_VALUES:
                channels.append(ChannelDomain(name, values=tuple(float(s) + 0.0 for s in seen), integer=True))
            else:
                low, high = _outward(float(seen[0]), float(seen[-1]))
                channels.append(ChannelDomain(name, low=low, high=high, integer=integer))
        lengths = (int(seq_len), 2 * int(seq_len)) if any_length else (int(seq_len),)
        return cls(tuple(channels), lengths, bool(any_length))

    def length_allowed(self, T: int) -> bool:
        return self.any_length or T in self.lengths

    def violation(self, x: np.ndarray) -> Violation | None:
        """The first input of x (n, T, n_inputs; finite) outside the domain, in (sequence,
        position, channel) order; a length outside it first."""
        T = x.shape[1]
        if not self.length_allowed(T):
            return Violation(f"T = {T}: it was verified at T = {self.lengths[0]} only (its task is not any_length)")
        bad = np.stack([ch.outside(x[:, :, c]) for c, ch in enumerate(self.channels)], axis=2)
        if not bad.any():
            return None
        i, t, c = (int(j) for j in np.argwhere(bad)[0])
        ch = self.channels[c]
        value = float(x[i, t, c])
        return Violation(f"sequence {i}, position {t}, channel {ch.name} = {_num(value)} (its domain: "
                         f"{ch.describe()})", i, t, ch.name, value)

    def describe(self) -> str:
        """One line for the report."""
        chans = "; ".join(f"{ch.name}: {ch.describe()}" for ch in self.channels)
        if self.any_length:
            span = f"any length (verified at T = {', '.join(map(str, self.lengths))})"
        else:
            span = f"T = {self.lengths[0]} only"
        return f"{self.n_inputs} channel(s): {chans}; {span}"

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict:
        return {"channels": [{"name": ch.name, "values": None if ch.values is None else list(ch.values),
                              "low": ch.low, "high": ch.high, "integer": ch.integer} for ch in self.channels],
                "lengths": list(self.lengths), "any_length": self.any_length}

    @classmethod
    def from_dict(cls, d: dict) -> "Domain":
        try:
            channels = tuple(ChannelDomain(str(ch["name"]),
                                           None if ch["values"] is None else tuple(float(v) for v in ch["values"]),
                                           None if ch["low"] is None else float(ch["low"]),
                                           None if ch["high"] is None else float(ch["high"]), bool(ch["integer"]))
                             for ch in d["channels"])
            domain = cls(channels, tuple(int(n) for n in d["lengths"]), bool(d["any_length"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise DomainError(f"a program's domain record is malformed ({type(exc).__name__}: {exc}); "
                              "expected Domain.to_dict()'s form") from None
        for ch in channels:
            if ch.values is None and (ch.low is None or ch.high is None or not ch.low <= ch.high):
                raise DomainError(f"a program's domain record gives channel {ch.name!r} neither values nor a "
                                  f"range low <= high (low={ch.low}, high={ch.high})")
        if not channels or not domain.lengths:
            raise DomainError("a program's domain record needs at least one channel and one length")
        return domain


def _num(v: float) -> str:
    """A value as a reader writes it: 2, not 2.0; 0.125; 1e+308."""
    return f"{v:g}" if v != int(v) or abs(v) >= 1e16 else str(int(v))


def _outward(low: float, high: float) -> tuple[float, float]:
    """[low, high] widened to the grid of a hundredth to a thousandth of its span's magnitude."""
    span = high - low
    if span <= 0 or not math.isfinite(span):
        return low, high
    step = 10.0 ** (math.floor(math.log10(span)) - 2)
    return (float(f"{math.floor(low / step) * step:.12g}"), float(f"{math.ceil(high / step) * step:.12g}"))


# ---------------------------------------------------------------------- the standalone source
CHECK_HELPER = '''
def _check_domain(xs):
    """Raise ValueError at the first item of xs outside DOMAIN (the inputs this program was
    verified on); program(xs, check_domain=False) skips the check and runs it anyway."""
    channels = DOMAIN["channels"]
    k = len(channels)
    if not DOMAIN["any_length"] and len(xs) not in DOMAIN["lengths"]:
        raise ValueError(f"xs has {len(xs)} items; this program was verified on sequences of length "
                         f"{DOMAIN['lengths'][0]} only")
    sets = [None if c["values"] is None else set(c["values"]) for c in channels]
    for t, item in enumerate(xs):
        if k == 1:
            row = (item,)
        elif isinstance(item, (str, bytes)) or not hasattr(item, "__len__") or len(item) != k:
            names = ", ".join(c["name"] for c in channels)
            raise ValueError(f"xs[{t}] is {item!r}; expected a tuple of {k} numbers ({names})")
        else:
            row = item
        for c, values, v in zip(channels, sets, row):
            if isinstance(v, (int, float)) and (v in values if values is not None else _in_range(v, c)):
                continue                       # the common case, without conversions
            _check_value(t, c, values, v)


def _in_range(f, c):
    return c["low"] <= f <= c["high"] and (not c["integer"] or f == int(f))


def _check_value(t, c, values, v):
    """The slow path: v converted to float (numpy scalars, fractions), then checked again."""
    try:
        f = float(v) if not isinstance(v, (str, bytes)) else None
    except (TypeError, ValueError):
        f = None
    if f is None:
        raise ValueError(f"xs[{t}], channel {c['name']}: {v!r} is not a number")
    if values is not None:
        if f in values:
            return
        want = "one of " + ", ".join(format(u, "g") for u in c["values"])
    else:
        if _in_range(f, c):
            return
        want = ("whole numbers" if c["integer"] else "reals") + f" in [{c['low']:g}, {c['high']:g}]"
    raise ValueError(f"xs[{t}], channel {c['name']} = {v!r} is outside the domain this program was "
                     f"verified on ({want}); program(xs, check_domain=False) runs it anyway")
'''


def domain_statements(domain: Domain) -> list[ast.stmt]:
    """`DOMAIN = {...}` (domain.to_dict() as a literal, built node by node: Program reads it back)
    and the `_check_domain` helper."""
    assign = ast.Assign(targets=[ast.Name("DOMAIN", ast.Store())], value=_literal(domain.to_dict()))
    return [assign, *ast.parse(CHECK_HELPER).body]


def _literal(obj) -> ast.expr:
    """A plain Python value as an AST literal (no text parsed: a channel name stays a string)."""
    if isinstance(obj, dict):
        return ast.Dict(keys=[ast.Constant(k) for k in obj], values=[_literal(v) for v in obj.values()])
    if isinstance(obj, list):
        return ast.List(elts=[_literal(v) for v in obj], ctx=ast.Load())
    if isinstance(obj, (str, bool, int, float)) or obj is None:
        return ast.Constant(obj)
    raise TypeError(f"no literal for {type(obj).__name__}")
