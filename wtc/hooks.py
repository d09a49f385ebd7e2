"""Hooks, TransformerLens style: named HookPoints inside wtc models, and one way to hook any module.

A HookPoint is an identity module at a named place in the forward pass; its `name` is its dotted
path in the root model ("blocks.0.attn.hook_pattern"). A hook fn takes (tensor, hook) and may
return a replacement (TransformerLens's convention); plain `register_forward_hook` works on a
HookPoint as well. Models derive from `Hooked` (TransformerLens's HookedRootModule) for
`hooks(fwd_hooks=...)`, `run_with_hooks`, `run_with_cache`, `add_hook` and `reset_hooks`.

`hook_modules` hooks arbitrary modules by path (Hugging Face models, TransformerLens models, any
nn.Module) through torch's public hooks. `has_hooks` tells fast paths that compute around the
forward (fused kernels, cached suffixes) whether anyone listens; it is the one place that reads
torch's private hook dicts.
"""
from __future__ import annotations

import contextlib
import difflib
from typing import Callable, Iterable

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from wtc.errors import HookError, HookNameError, HookTypeError, WtcError

HookFn = Callable[[torch.Tensor, nn.Module], "torch.Tensor | None"]


def _listened(module: nn.Module) -> bool:
    # torch has no public "are there hooks" query; this is the one place wtc reads the dicts
    return bool(module._forward_hooks or module._forward_pre_hooks)


def has_hooks(module: nn.Module) -> bool:
    """Whether a forward (pre-)hook is registered on `module` or any of its submodules."""
    return any(m.has_hooks if isinstance(m, HookPoint) else _listened(m) for m in module.modules())


class HookPoint(nn.Module):
    """Identity at a named place in the forward pass."""

    def __init__(self):
        super().__init__()
        self.name: str | None = None              # set by the root model (Hooked.hook_dict)
        self._handles: list[RemovableHandle] = []  # hooks added with add_hook, for remove_hooks

    def forward(self, x):
        return x

    @property
    def has_hooks(self) -> bool:
        """Whether anyone listens here (add_hook or plain register_forward_hook / _pre_hook)."""
        return _listened(self)

    def add_hook(self, fn: HookFn) -> RemovableHandle:
        """Call fn(tensor, self) on every forward; a tensor it returns replaces the value."""
        if not callable(fn):
            raise HookTypeError(f"a hook on {self.name!r} must be callable (tensor, hook) -> tensor | None, "
                                f"got {type(fn).__name__}")

        def call(module, args, out):
            try:
                new = fn(out, module)
            except WtcError:
                raise
            except Exception as exc:              # a user hook: named, chained (its traceback stays)
                raise HookError(f"the hook on {self.name!r} raised {type(exc).__name__}: {exc} (hooks are "
                                "called as fn(tensor, hook))") from exc
            return _replacement(new, out, repr(self.name))
        handle = self.register_forward_hook(call)
        # drop handles removed meanwhile, so repeated hooks() contexts do not grow the list
        self._handles = [h for h in self._handles if h.id in self._forward_hooks] + [handle]
        return handle

    def remove_hooks(self) -> None:
        """Remove every hook added with add_hook (plain register_forward_hook ones stay)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def extra_repr(self) -> str:
        return repr(self.name) if self.name else ""


class Hooked(nn.Module):
    """A root module whose HookPoints are addressed by name. Subclasses call `self.setup_hooks()`
    at the end of __init__ so every HookPoint knows its name from the start.

    A name_or_filter is a hook name, a list of names, or a callable name -> bool."""

    def setup_hooks(self) -> None:
        """Name every HookPoint by its path (hook_dict renames them too, so a model used as a
        submodule of another root still reports the names its own calls use)."""
        _ = self.hook_dict

    @property
    def hook_dict(self) -> dict[str, HookPoint]:
        """{dotted path: HookPoint}; names every point by its path in this model."""
        points = {name: m for name, m in self.named_modules() if isinstance(m, HookPoint)}
        for name, point in points.items():
            point.name = name
        return points

    def hook_points(self) -> list[HookPoint]:
        return list(self.hook_dict.values())

    def _select(self, spec, what: str = "hook", points: dict[str, HookPoint] | None = None) -> dict[str, HookPoint]:
        points = self.hook_dict if points is None else points
        if spec is None:
            return points
        if callable(spec):
            try:
                return {n: p for n, p in points.items() if spec(n)}
            except Exception as exc:
                raise HookError(f"the {what} filter raised {type(exc).__name__}: {exc} (it is called on each "
                                "hook name and returns True for the points wanted)") from exc
        names = [spec] if isinstance(spec, str) else spec
        if not isinstance(names, (list, tuple, set, frozenset)) or not all(isinstance(n, str) for n in names):
            raise HookError(f"a {what} is a hook name, a list of names or a callable on names, got {spec!r}")
        for n in names:
            if n not in points:
                near = difflib.get_close_matches(n, points, n=3) or list(points)[:6]
                raise HookNameError(f"{type(self).__name__} has no hook point {n!r}; nearest: {', '.join(near)}")
        wanted = set(names)
        return {n: p for n, p in points.items() if n in wanted}

    def _matching(self, name_or_filter, points=None) -> dict[str, HookPoint]:
        chosen = self._select(name_or_filter, points=points)
        if callable(name_or_filter) and not chosen:
            raise HookNameError(f"the hook filter {name_or_filter!r} matches none of {type(self).__name__}'s "
                                f"hook points (e.g. {', '.join(list(self.hook_dict)[:4])})")
        return chosen

    def add_hook(self, name_or_filter, fn: HookFn) -> list[RemovableHandle]:
        """fn on every matching hook point until the handles are removed or reset_hooks()."""
        return [point.add_hook(fn) for point in self._matching(name_or_filter).values()]

    def reset_hooks(self) -> None:
        """Remove every hook added through this API (plain register_forward_hook ones stay)."""
        for point in self.hook_points():
            point.remove_hooks()

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Iterable = ()):
        """Within the block, each (name_or_filter, fn) of fwd_hooks is attached; removed on exit,
        also when the block raises."""
        handles: list[RemovableHandle] = []
        points = self.hook_dict                   # resolved once: a cache of every point is one context
        try:
            if isinstance(fwd_hooks, (str, dict)):
                raise HookError(f"fwd_hooks must be a list of (name or filter, fn) pairs, got {type(fwd_hooks).__name__}")
            for pair in fwd_hooks:
                if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                    raise HookError(f"fwd_hooks must be (name or filter, fn) pairs, got {pair!r:.80}")
                name_or_filter, fn = pair
                handles += [p.add_hook(fn) for p in self._matching(name_or_filter, points=points).values()]
            yield self
        finally:
            for h in handles:
                h.remove()

    def run_with_hooks(self, *args, fwd_hooks: Iterable = (), **kwargs):
        """self(*args, **kwargs) with fwd_hooks attached for this call only."""
        with self.hooks(fwd_hooks):
            return self(*args, **kwargs)

    @contextlib.contextmanager
    def caching(self, names_filter=None):
        """Within the block, the dict it yields fills with {hook name: detached value} of the
        hook points names_filter selects (None: all). What run_with_cache is built on."""
        cache: dict[str, torch.Tensor] = {}

        def keep(name):
            return lambda value, hook: cache.__setitem__(name, value.detach())

        with self.hooks([(name, keep(name)) for name in self._select(names_filter, "names_filter")]):
            yield cache

    def run_with_cache(self, *args, names_filter=None, **kwargs):
        """(self(*args, **kwargs), {hook name: detached value}) for the hooks names_filter selects."""
        with self.caching(names_filter) as cache:
            out = self(*args, **kwargs)
        return out, cache


def _module(model: nn.Module, path: str) -> nn.Module:
    """The module at `path`; failing that, a TransformerLens-style `hook_dict` entry (TransformerLens
    3's TransformerBridge names its hook points after the wrapped model's modules and keeps the
    HookedTransformer names, "blocks.0.hook_resid_post", as aliases there)."""
    try:
        return model.get_submodule(path)
    except AttributeError:
        alias = getattr(model, "hook_dict", None)
        if isinstance(alias, dict) and isinstance(alias.get(path), nn.Module):
            return alias[path]
        names = [n for n, _ in model.named_modules() if n][:15]
        raise HookNameError(f"no module named {path!r}; modules include: {', '.join(names)} ...") from None


def _unpack(value, path: str, what: str):
    """(tensor, repack): a tensor as is, a tuple by its element 0."""
    if isinstance(value, torch.Tensor):
        return value, lambda new: new
    if isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):
        rebuild = type(value)._make if hasattr(value, "_fields") else tuple     # namedtuples keep their type
        return value[0], lambda new: rebuild((new, *value[1:]))
    raise HookTypeError(f"module {path!r} {what} {type(value).__name__}, not a tensor (or a tuple starting with one)")


def _replacement(new, value: torch.Tensor, where: str):
    """What a hook returned, checked: None (keep the value) or a tensor of the value's shape and
    dtype (anything else would broadcast, or fail later deep inside the model)."""
    if new is None:
        return None
    if not torch.is_tensor(new) or new.shape != value.shape or new.dtype != value.dtype:
        got = f"{tuple(new.shape)} {new.dtype}" if torch.is_tensor(new) else type(new).__name__
        raise HookError(f"the hook on {where} returned {got}; a hook returns None or a tensor of the shape and "
                        f"dtype it was given, {tuple(value.shape)} {value.dtype}")
    if new.device != value.device:
        raise HookError(f"the hook on {where} returned a tensor on {new.device}; it was given one on {value.device} "
                        "and must return one there")
    return new


def _call(fn, value, module, where: str):
    """A user hook's fn(value, module); what it raises becomes a HookError naming where (chained)."""
    try:
        return fn(value, module)
    except WtcError:
        raise
    except Exception as exc:
        raise HookError(f"the hook on {where} raised {type(exc).__name__}: {exc} (hooks are called as "
                        "fn(tensor, module))") from exc


@contextlib.contextmanager
def hook_modules(model: nn.Module, hooks: Iterable[tuple[str, HookFn]], *, on: str = "output"):
    """Within the block, fn(tensor, module) runs on each module named by path in hooks=[(path, fn)]
    ("" is the model itself): on its output (on="output") or its first positional input
    (on="input"). A tensor fn returns replaces that value. For a tuple, fn sees element 0 and its
    replacement is packed back in. Unknown paths raise HookNameError before anything is attached."""
    if on not in ("output", "input"):
        raise HookError(f"on must be 'output' or 'input', got {on!r}")
    if isinstance(hooks, (str, bytes)) or not isinstance(hooks, Iterable):
        raise HookTypeError(f"hooks must be a list of (path, fn) pairs, got {type(hooks).__name__}")
    targets = []
    for item in hooks:
        if not isinstance(item, (tuple, list)) or len(item) != 2 or not isinstance(item[0], str):
            raise HookTypeError(f"hooks must be (path, fn) pairs, got {item!r}")
        if not callable(item[1]):
            raise HookTypeError(f"the hook for {item[0]!r} must be callable (tensor, module) -> tensor | None, "
                                f"got {type(item[1]).__name__}")
        targets.append((item[0], _module(model, item[0]), item[1]))
    handles = []

    def output_hook(path, fn):
        def hook(module, args, out):
            value, repack = _unpack(out, path, "returns")
            new = _replacement(_call(fn, value, module, f"module {path!r}"), value, f"module {path!r}")
            return None if new is None else repack(new)
        return hook

    def input_hook(path, fn):
        def hook(module, args):
            if not args:
                raise HookError(f"module {path!r} was called without a positional input to hook")
            value, repack = _unpack(args[0], path, "takes")
            new = _replacement(_call(fn, value, module, f"the input of module {path!r}"), value,
                               f"the input of module {path!r}")
            return None if new is None else (repack(new), *args[1:])
        return hook

    try:
        for path, module, fn in targets:
            handles.append(module.register_forward_hook(output_hook(path, fn)) if on == "output"
                           else module.register_forward_pre_hook(input_hook(path, fn)))
        yield
    finally:
        for h in handles:
            h.remove()


__all__ = ["HookPoint", "Hooked", "hook_modules", "has_hooks"]
