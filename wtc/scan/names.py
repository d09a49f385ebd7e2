"""Which parameters a scan means: names and fnmatch patterns, in the model's own spelling.

A model that wraps another (wtc.models.hf.HFModel keeps the Hugging Face model as `.hf`) holds
its parameters under that attribute, so `named_parameters()` says `hf.transformer.h.0.mlp.c_fc.weight`
where the Hugging Face model itself says `transformer.h.0.mlp.c_fc.weight`. Both spellings are
accepted: a pattern that matches no full name is tried again under the wrapper's prefix (the one
child module that holds every parameter). Results keep the full names (the store's identity), and
ScanResult looks a name up in either spelling. A pattern that matches neither is tried on the
parameters' other names (wtc.scan.bridge_names: a TransformerBridge's `blocks.1.mlp.out.weight`,
HookedTransformer names such as `blocks.1.mlp.W_out`, a tied weight's other path), and a
TransformerLens short form (`W_Q`, `mlp.W_out`) as the full pattern it stands for. A name that
matches none is a one-line UnknownName that lists the closest names.
"""
from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Sequence

from torch import nn

from wtc.errors import ScanError, UnknownName

Params = str | Sequence[str] | None
"""What `scan(params=)` takes: None (every parameter with >= 2 dims), a name or fnmatch pattern, or a list of them."""


def wrapper_prefix(names: Iterable[str]) -> str:
    """'child.' when every parameter name lies under one child module (a wrapper such as HFModel's
    `hf.`), else ''. Only one level: what is under the child is the wrapped model's own spelling."""
    names = list(names)
    heads = {n.split(".", 1)[0] for n in names if "." in n}
    flat = any("." not in n for n in names)
    return f"{heads.pop()}." if len(heads) == 1 and not flat else ""


def _close(name: str, names: list[str], prefix: str) -> list[str]:
    """The parameter names nearest to `name`, in the spelling the user wrote it in."""
    spelled = ([n[len(prefix):] if n.startswith(prefix) else n for n in names] if prefix and not name.startswith(prefix)
               else names)
    return difflib.get_close_matches(name, spelled, n=3, cutoff=0.6)


def _unknown(what: str, pattern: str, names: list[str], prefix: str, among: str = "parameter",
             tl_hint: str = "") -> UnknownName:
    close = _close(pattern, names, prefix)
    if close:
        hint = f"closest: {', '.join(close)}"
    else:
        shown = [n[len(prefix):] for n in names[:8]] if prefix else names[:8]
        hint = f"{among}s are: {', '.join(shown)}{' ...' if len(names) > 8 else ''}"
    also = f" (with or without the wrapper's {prefix!r})" if prefix else ""
    return UnknownName(f"{what + ': ' if what else ''}no {among} matches {pattern!r}{also}; {hint}{tl_hint}")


def match(pattern: str, names: list[str], prefix: str | None = None) -> list[str]:
    """The full names a name / fnmatch pattern selects: as written, else under the wrapper's prefix."""
    prefix = wrapper_prefix(names) if prefix is None else prefix
    hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
    if not hits and prefix and not pattern.startswith(prefix):
        hits = [n for n in names if fnmatch.fnmatchcase(n, prefix + pattern)]
    return hits


def select(model: nn.Module, params: Params) -> dict[str, nn.Parameter]:
    """{full name: parameter} for `params` (None: every parameter with >= 2 dimensions)."""
    named = dict(model.named_parameters())
    if params is None:
        chosen = {n: p for n, p in named.items() if p.ndim >= 2}
        if not chosen:       # else a scan of nothing reports weights_scanned: 0 as if it had looked
            raise ScanError(f"the model has no weight matrices to scan (no parameter with >= 2 dimensions; it has "
                            f"{len(named)} parameter(s)" + (f": {', '.join(list(named)[:6])}" if named else "")
                            + "); name the parameters to scan with params=")
        return chosen
    if not isinstance(params, str) and not isinstance(params, (list, tuple, set, frozenset)):
        raise ScanError(f"params must be None, a name / pattern or a list of them, got {type(params).__name__}")
    patterns = [params] if isinstance(params, str) else list(params)
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise ScanError(f"params must be None (every matrix) or names / patterns (str), got {params!r}")
    names = list(named)
    prefix = wrapper_prefix(names)
    chosen = {}
    table = None                       # other names of the parameters (bridges, TransformerLens), built once if needed
    for pat in patterns:
        hits = match(pat, names, prefix)
        if not hits:
            from wtc.scan import bridge_names
            table = bridge_names.aliases(model) if table is None else table
            short = bridge_names.short_form(pat)
            for p in (pat,) if short is None else (pat, short):
                hits = (hits or match(p, names, prefix) or bridge_names.match(model, p, table)
                        or (prefix and bridge_names.match(model, prefix + p, table)) or [])
        if not hits:
            raise _unknown("", pat, names + list(table or {}), prefix, tl_hint=_tl_hint(model, pat))
        chosen.update((n, named[n]) for n in hits)
    return chosen


def _tl_hint(model: nn.Module, pattern: str) -> str:
    """What to do when a TransformerLens name meets a model that has no such names (a Hugging Face
    model read by wtc.models.hf: its own names only)."""
    from wtc.scan import bridge_names
    leaf = pattern.rsplit(".", 1)[-1]
    if leaf not in bridge_names.SHORT and leaf not in ("w", "b") and bridge_names.short_form(pattern) is None:
        return ""
    return ("; TransformerLens names need a HookedTransformer or a TransformerBridge over the model "
            "(wtc.models.tl.load_bridge; `wtc scan --bridge`)")


def resolve(name: str, names: list[str], prefix: str, what: str = "name", among: str = "scanned parameter",
            aliases: dict[str, str] | None = None) -> str:
    """The full name `name` stands for among `names` (exact, or under `prefix`: the wrapped model's
    own spelling, or one of its `aliases`: wtc.scan.bridge_names); `prefix` is the model's
    wrapper_prefix (of all its parameters, not of `names`)."""
    if name in names:
        return name
    if prefix and prefix + name in names:
        return prefix + name
    for alias in (name, prefix + name) if aliases else ():
        if aliases.get(alias) in names:
            return aliases[alias]
    raise _unknown(what, name, names, prefix, among)
