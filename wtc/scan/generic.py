"""The scan's generic path: ablated logits of any nn.Module with a readout, by the fastest exact method.

(Over 500 lines because the rows method's per-module corrections, the checks that it applies (a
traced clean pass, a batch-independence probe, agreement with the naive loop) and the method choice
share one evaluator's state; the tracer is the first piece to split out.)

Three methods, each exact (copy k's logits are the model's with weight k zeroed, on the same readout):
- "rows": the model runs once on `a` copies of the tokens (a batch of a*B sequences) and a forward
  hook on each module holding the parameter corrects copy k's rows of that module's output for
  copy k's zeroed weight, without copying the parameter:
      nn.Linear / transformers' Conv1D weight W[i, j]   y[..., i] -= W[i, j] * x[..., j]
      their bias b[i]                                    y[..., i] -= b[i]
      nn.Embedding weight E[r, c]                        y[..., c] = 0 where the id is r
      nn.LayerNorm weight w[k] / bias b[k]               y[..., k] = b[k] (or 0) / y[..., k] -= b[k]
      nn.RMSNorm weight w[k]                             y[..., k] = 0
  Everything downstream (tied uses included: GPT-2's embedding is also its head) runs as in the
  model; everything upstream does not run at all: the module calls that end before the
  parameter's first use, and that first call itself (its input is computed before any use, so
  it is the same in every copy), return their clean outputs (kept from one clean pass per
  parameter, batch-major tensors tiled to the copies), so a weight in the last block of a model
  costs its block's rest and the head, not a forward. An embedding row that the scan's ids never
  look up (a token absent from them, a position past their length) changes no embedding output:
  its copies start at the parameter's next use (GPT-2's tied head: the head's cost, not a
  forward) or, with none, are the clean logits (KL exactly 0, no forward at all). Used where a
  traced clean pass shows that every use of the parameter is the forward of such a module (its own class's forward, no hooks of the caller's on it, a batch-major input),
  where the model and readout keep batch rows independent (a probe: the clean tokens between two
  other sequences give the clean logits), and where the first batch of the parameter agrees with
  the naive loop on its largest weight; otherwise the parameter falls back.
- "vmap": `a` copies of the parameter, each with one weight zeroed, through
  torch.func.vmap(functional_call(model, ...)) (any parameter torch.func can batch).
- "naive": zero in place, forward, restore (wtc.scan.reference's loop).

Method choice (`Generic.method`): "rows" wherever it applies (its cost per weight is at most a
forward, the naive loop's, and less by the reused prefix), with copies per forward found per
parameter by doubling from 1 on the scan's own work (each size timed twice; doubling stops at a
size 10% slower per weight than the best, at two sizes in a row not faster than it, or at the
activation budget / the scan's batch; the best is kept), so a compute-bound model settles at 1-2
copies and a small model whose forward is per-op overhead runs dozens at once. Elsewhere the first batch of the parameter times the naive
loop on its largest weight against vmap on the whole batch, and the faster per weight is kept
(vmap only if it agrees with the naive loop on that weight). `FORCE` ("rows", "vmap", "naive") pins a method, for the bench and
tests; "rows" where it does not apply falls back as above.
"""
from __future__ import annotations

import sys
import time
import weakref
from collections import defaultdict

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.overrides import TorchFunctionMode

from wtc.errors import WtcError
from torch.utils._pytree import tree_leaves

from wtc.hooks import has_hooks
from wtc.errors import ScanError

FORCE: str | None = None     # "rows" | "vmap" | "naive" | None (choose)
LAST = None                  # weakref to the most recent Generic (its .method and copies per forward), for the bench
WORSE = 1.10                 # copies per forward: doubling stops at a size 10% slower per weight than the best


class _NotRows(WtcError):
    """The rows method met something it cannot correct exactly (the parameter falls back)."""


class _Disagrees(WtcError):
    """A batched method disagreed with the naive loop on a parameter's largest weight."""


# What reading a parameter may do without being a use that changes the output.
_VALUE_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
                torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.numpy}


def _conv1d_class():
    """transformers' Conv1D (GPT-2's linear maps, weight (in, out)) if transformers is loaded."""
    mod = sys.modules.get("transformers.pytorch_utils")
    return getattr(mod, "Conv1D", None)


def _kind(module: nn.Module, leaf: str) -> str | None:
    """The correction rule for `leaf` of `module`, or None: only a module whose forward is its
    library class's own (not overridden by a subclass or on the instance)."""
    if "forward" in vars(module):
        return None
    fwd = type(module).forward
    if fwd is nn.Linear.forward and leaf in ("weight", "bias"):
        return "linear." + leaf
    conv1d = _conv1d_class()
    if conv1d is not None and fwd is conv1d.forward and leaf in ("weight", "bias"):
        return "conv1d." + leaf
    if fwd is nn.Embedding.forward and leaf == "weight" and module.max_norm is None:
        return "embedding.weight"
    if fwd is nn.LayerNorm.forward and leaf in ("weight", "bias"):
        return "layernorm." + leaf
    rms = getattr(nn, "RMSNorm", None)
    if rms is not None and fwd is rms.forward and leaf == "weight":
        return "rmsnorm.weight"
    return None


def _expected_func(kind: str):
    family = kind.split(".")[0]
    return {"linear": torch.nn.functional.linear, "conv1d": torch.addmm,
            "embedding": torch.nn.functional.embedding, "layernorm": torch.nn.functional.layer_norm,
            "rmsnorm": getattr(torch.nn.functional, "rms_norm", None)}[family]


class _Uses(TorchFunctionMode):
    """Records, for each parameter, every torch function that reads it and the module running then."""

    def __init__(self, names_by_id: dict[int, str], stack: list):
        super().__init__()
        self.names, self.stack = names_by_id, stack
        self.uses: dict[str, list] = defaultdict(list)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        hits = [self.names[id(a)] for a in tree_leaves((args, kwargs))
                if isinstance(a, torch.Tensor) and id(a) in self.names]
        if hits:
            # reading metadata (shape, dtype, a flag) is not a use; reading values or making a tensor is
            harmless = func not in _VALUE_READS and not any(isinstance(x, torch.Tensor) for x in tree_leaves(out))
            top = self.stack[-1] if self.stack else None
            for name in hits:
                if not harmless:
                    self.uses[name].append((top, func))
        return out


def _input_of(args, kwargs):
    if args:
        return args[0]
    for key in ("input", "x", "hidden_states"):
        if key in kwargs:
            return kwargs[key]
    raise _NotRows("module called without its input")


class _Call:
    """One module call of the traced clean pass: its order (start, end), nesting, and for an
    embedding's call the ids it looked up (sorted, unique)."""
    __slots__ = ("module", "call", "start", "end", "parent", "children", "ids")

    def __init__(self, module, call, start, parent):
        self.module, self.call, self.start, self.end, self.parent, self.children = module, call, start, None, parent, []
        self.ids = None


def _tileable(out) -> bool:
    if out is None or isinstance(out, (torch.Tensor, bool, int, float, str)):
        return True
    return type(out) in (tuple, list) and all(_tileable(o) for o in out)


def _copy(out, originals: dict):
    """A copy of a tileable output; originals[id(tensor)] = its copy."""
    if isinstance(out, torch.Tensor):
        originals[id(out)] = out.clone()
        return originals[id(out)]
    if isinstance(out, (tuple, list)):
        return type(out)(_copy(o, originals) for o in out)
    return out


def _tile(out, B: int, a: int, needed: set):
    """A clean output for a batch of `a` copies: the tensors read downstream copied (batch-major
    ones, first dimension B, repeated a times; others, e.g. (1, T, D) position terms, as they are),
    the rest the clean tensors themselves."""
    if isinstance(out, torch.Tensor):
        if id(out) not in needed:
            return out
        if out.ndim and out.shape[0] == B:
            return out.repeat(a, *([1] * (out.ndim - 1)))
        return out.clone()
    if isinstance(out, (tuple, list)):
        return type(out)(_tile(o, B, a, needed) for o in out)
    return out


class _Prefix:
    """The clean outputs of a parameter's prefix calls, handed out for `a` copies. Copies are kept
    from one forward to the next while nothing writes to them (tensor versions unchanged); a write
    to a clean tensor handed out as it is means that something did read it after all: _NotRows."""

    def __init__(self, calls: dict, needed: set, B: int):
        self.calls, self.needed, self.B = calls, needed, B
        self.given: dict = {}                        # (module id, call) -> (a, output, [(tensor, version)])
        self.clean_versions = {id(t): t._version for _, c in calls.values() for out in c.values()
                               for t in tree_leaves(out) if isinstance(t, torch.Tensor)}

    def output(self, key: int, k: int, a: int):
        got = self.given.get((key, k))
        if got is not None and got[0] == a and all(t._version == v for t, v in got[2]):
            return got[1]
        out = _tile(self.calls[key][1][k], self.B, a, self.needed)
        copies = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and id(t) not in self.clean_versions]
        self.given[(key, k)] = (a, out, [(t, t._version) for t in copies])
        return out

    def after_forward(self) -> None:
        for _, c in self.calls.values():
            for out in c.values():
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor) and t._version != self.clean_versions[id(t)]:
                        raise _NotRows("a clean prefix output was written to")


class _Sizes:
    """Copies per forward of the rows method: doubled from 1 (each size timed twice, on the scan's
    own work) until a size is 10% slower per weight than the best so far, or two in a row are not
    faster than it, or the cap; then the best is kept."""

    def __init__(self, cap: int):
        self.cap = max(1, cap)
        self.times: dict[int, list[float]] = {}     # size -> seconds per weight of each timed run
        self.settled: int | None = None
        self.misses = 0                              # sizes in a row, since the best, that were not better
        self.largest_batch = 0                       # the most weights one call has asked for

    def _candidate(self) -> int:
        s = 1
        while len(self.times.get(s, ())) >= 2:
            s *= 2
        return s

    def _best(self) -> int:
        return min(self.times, key=lambda s: min(self.times[s])) if self.times else 1

    def next(self, remaining: int, batch: int) -> tuple[int, bool]:
        """(copies for the next forward, whether to time it); batch: weights in this call."""
        self.largest_batch = max(self.largest_batch, batch)
        if self.settled is None:
            s = self._candidate()
            if s > self.cap or (s > self.largest_batch and batch == self.largest_batch):
                self.settled = min(self._best(), self.cap)   # nothing larger can be run
            elif s <= remaining:
                return s, True
            else:
                return remaining, False                       # the end of a batch: not a measurement
        return min(self.settled, remaining), False

    def record(self, size: int, seconds: float) -> None:
        self.times.setdefault(size, []).append(seconds / size)
        if len(self.times[size]) < 2:
            return
        best = self._best()
        if best == size:
            self.misses = 0
            return
        # a shared machine's timings jump by 10-20%: one size that is not the best does not stop
        # the doubling unless it is clearly worse; two in a row do
        self.misses += 1
        if min(self.times[size]) > WORSE * min(self.times[best]) or self.misses >= 2:
            self.settled = min(best, self.cap)


class Generic:
    """Ablated logits (A, N, V) of `model` under `readout` for one parameter's weights at a time."""

    def __init__(self, model: nn.Module, tokens: torch.Tensor, readout, logits: torch.Tensor,
                 budget: int, force: str | None = None):
        self.model, self.tokens, self.readout = model, tokens, readout
        self.clean = logits.detach()                       # (B, T, V)
        self.B, self.V = tokens.shape[0], logits.shape[-1]
        self.budget = budget
        self.force = force if force is not None else FORCE
        if self.force not in (None, "rows", "vmap", "naive"):
            raise ScanError(f"FORCE must be 'rows', 'vmap', 'naive' or None, got {self.force!r}")
        self.method: dict[str, str] = {}                   # parameter -> chosen method
        self.checked: set[str] = set()                     # rows parameters verified against the naive loop
        self._owners = None                                # parameter -> [(module, kind)] or None: no rows
        self._independent = None
        self._cap = 1                                      # copies per forward the activation budget allows
        self._sizes: dict[str, _Sizes] = {}                # parameter -> its search for copies per forward
        self._repeated = {}
        self._prefix = {}                                  # (parameter, first live use) -> clean outputs of its prefix calls
        self._uses = {}                                    # parameter -> the module calls using it, in order
        self._hooked = set()
        self._timing = {}                                  # parameter -> {method: seconds per weight}
        global LAST
        LAST = weakref.ref(self)

    def copies_per_forward(self, name: str) -> int | None:
        """The rows method's settled copies per forward for a parameter (None: still searching, or
        not the rows method)."""
        sizes = self._sizes.get(name)
        return None if sizes is None else sizes.settled

    # ------------------------------------------------------------------ public
    def ablated_logits(self, name: str, param: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        idx = idx.to(param.device)
        with torch.no_grad():
            method = self.method.get(name) or self._choose(name, param, idx)
            if method == "rows":
                try:
                    return self._rows_checked(name, param, idx)
                except _Disagrees:                        # a use the trace could not see: only the
                    self._owners[name] = None             # naive loop is sure to see it too
                    self.method[name] = method = "naive"
                except Exception as exc:                  # _NotRows, or the model refusing a*B rows
                    if self.force == "rows" and not isinstance(exc, _NotRows):
                        raise
                    self._owners[name] = None
                    method = self._fallback(name)
            if method == "pending":                       # time naive vs vmap on this batch
                return self._calibrate(name, param, idx)
            return self._vmap(name, param, idx) if method == "vmap" else self._naive(param, idx)

    # ------------------------------------------------------------------ choice
    def _choose(self, name, param, idx) -> str:
        if self.force in ("vmap", "naive"):
            self.method[name] = self.force
        elif self._rows_apply(name):
            self.method[name] = "rows"
        else:
            return self._fallback(name)
        return self.method[name]

    def _fallback(self, name) -> str:
        if self.force in ("vmap", "naive"):
            self.method[name] = self.force
        else:
            self.method.pop(name, None)
            return "pending"
        return self.method[name]

    def _calibrate(self, name, param, idx) -> torch.Tensor:
        """One batch: the naive loop on its largest weight, vmap on all of it; the faster per
        weight is kept, vmap only where it agrees with the naive loop on that weight."""
        if len(idx) == 1:
            return self._naive(param, idx)                  # undecided until a batch of several
        k = int(param.detach().reshape(-1)[idx].abs().argmax())
        t0 = time.perf_counter()
        want = self._naive(param, idx[k:k + 1])
        naive_s = self._elapsed(t0, want)
        t0 = time.perf_counter()
        try:
            out = self._vmap(name, param, idx)
            vmap_s = self._elapsed(t0, out) / len(idx)
            if not self._agree(out[k], want[0]):            # e.g. a tensor sharing the parameter's memory
                vmap_s = float("inf")
        except Exception:                                   # a model torch.func cannot batch
            vmap_s = float("inf")
        self._timing[name] = {"naive": naive_s, "vmap": vmap_s}
        self.method[name] = "vmap" if vmap_s < naive_s else "naive"
        if vmap_s == float("inf"):
            out = self._naive(param, idx)
        return out

    def _agree(self, got: torch.Tensor, want: torch.Tensor) -> bool:
        return bool(((got - want).abs() <= self._tol() * self._scale()).all())

    def _elapsed(self, t0, out) -> float:
        if out.is_cuda:
            torch.cuda.synchronize(out.device)
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ naive and vmap
    def _naive(self, param, idx) -> torch.Tensor:
        data = param.data
        out = []
        for i in idx.tolist():
            where = tuple(int(v) for v in np.unravel_index(i, tuple(data.shape))) if data.ndim else ()
            keep = data[where].clone()
            data[where] = 0
            try:
                out.append(self.readout(self.model(self.tokens)).reshape(-1, self.V))
            finally:
                data[where] = keep
        return torch.stack(out)

    def _vmap(self, name, param, idx) -> torch.Tensor:
        A = len(idx)
        copies = param.detach().reshape(1, -1).repeat(A, 1)
        copies[torch.arange(A, device=param.device), idx] = 0
        copies = copies.reshape(A, *param.shape)

        def run(p):
            return self.readout(functional_call(self.model, {name: p}, (self.tokens,)))
        kept = [(m, dict(m._parameters)) for m in self.model.modules()]
        try:
            out = vmap(run)(copies).reshape(A, -1, self.V)
        finally:
            # functional_call swaps the parameter in and back; a module that forwards attribute
            # writes to another (TransformerLens bridges: q/k/v are views of a fused weight) gets
            # something else back, which would break every later pass: put the originals back
            swapped = [k for m, params in kept for k, v in params.items() if m._parameters.get(k) is not v]
            for m, params in kept:
                m._parameters.update(params)
        if swapped:
            raise ScanError(f"torch.func could not swap {name!r} in and out cleanly ({', '.join(swapped)} came back "
                            f"changed); scanning it by zeroing weights in place")
        return out

    # ------------------------------------------------------------------ rows: when it applies
    def _rows_apply(self, name) -> bool:
        if self._owners is None:
            self._trace()
        if not self._owners.get(name):
            return False
        if self._independent is None:
            self._independent = self._probe()
        return self._independent

    def _trace(self) -> None:
        """One clean pass recording every use of every parameter (which function, inside which
        module call), the tree of module calls in order, and the first dimension of the owning
        modules' inputs."""
        params = dict(self.model.named_parameters())
        by_id = {id(p): n for n, p in params.items()}
        owners = defaultdict(list)
        for module in self.model.modules():
            for leaf, p in module._parameters.items():
                if p is not None and id(p) in by_id:
                    owners[by_id[id(p)]].append((module, leaf))
        hooked = {id(m) for m in self.model.modules() if has_hooks(m)}     # the caller's hooks, before ours
        stack, batch_dims, widest, clock, calls = [], defaultdict(set), [0], [0], defaultdict(int)
        owner_ids = {id(m) for pairs in owners.values() for m, _ in pairs}
        embeddings = {id(m) for pairs in owners.values() for m, leaf in pairs if _kind(m, leaf) == "embedding.weight"}

        def pre(module, args, kwargs):
            node = _Call(module, calls[id(module)], clock[0], stack[-1] if stack else None)
            calls[id(module)] += 1
            clock[0] += 1
            if node.parent is not None:
                node.parent.children.append(node)
            stack.append(node)
            if id(module) in owner_ids:
                try:
                    x = _input_of(args, kwargs)
                    batch_dims[id(module)].add(x.shape[0] if isinstance(x, torch.Tensor) and x.ndim else None)
                    if id(module) in embeddings and isinstance(x, torch.Tensor) and not x.is_floating_point():
                        node.ids = torch.unique(x.detach())
                except _NotRows:
                    batch_dims[id(module)].add(None)

        def post(module, args, kwargs, out):
            node = stack.pop()
            node.end = clock[0]
            clock[0] += 1
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    widest[0] = max(widest[0], t.numel())

        handles = []
        try:
            for module in self.model.modules():
                handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
                handles.append(module.register_forward_hook(post, with_kwargs=True))
            with _Uses(by_id, stack) as mode:
                self.readout(self.model(self.tokens))
        finally:
            for h in handles:
                h.remove()
        self._owners, self._uses = {}, {}
        for name, pairs in owners.items():
            modules = {id(m): m for m, _ in pairs}
            rules = [(m, _kind(m, leaf)) for m, leaf in pairs]
            uses = mode.uses.get(name, ())
            ok = (all(kind is not None and id(m) not in hooked and batch_dims.get(id(m), {self.B}) <= {self.B, 1}
                      for m, kind in rules)
                  and all(top is not None and id(top.module) in modules and func is _expected_func(
                          next(k for m, k in rules if m is top.module)) for top, func in uses))
            self._owners[name] = rules if ok else None
            if ok and uses:
                self._uses[name] = sorted({id(top): top for top, _ in uses}.values(), key=lambda n: n.start)
        self._hooked = hooked
        # a copy's live activations: a few of the widest module outputs (floats), and its logits
        per_copy = 4 * max(widest[0], self.clean.numel())
        self._cap = max(1, self.budget // per_copy)

    def _live_use(self, name, row: int):
        """The first use of `name` whose output changes when a weight of row `row` (of an embedding)
        is zeroed, or None when no use does. An embedding call that never looks the row up (a token
        absent from the scan's tokens, a position past their length) returns its clean output in
        every copy: it is skipped, and the copies start at the next use (the head, where the
        embedding is tied to it) or, with none, keep the clean logits."""
        for node in self._uses.get(name, []):
            if node.ids is None or bool((node.ids == row).any()):
                return node
        return None

    def _prefix_calls(self, first) -> list:
        """The module calls whose outputs copies starting at use `first` can reuse from a clean
        pass: that call (its input is computed before it, so it is the same in every copy) and
        every call that ended before it, outermost first (not those of modules carrying the
        caller's hooks, whose effects would run twice)."""
        if first is None:
            return []
        chosen = [first]
        node = first
        while node.parent is not None:
            for sibling in node.parent.children:
                if sibling.end is not None and sibling.end < first.start:
                    chosen.extend(self._clean_subtree(sibling))
            node = node.parent
        return chosen

    def _clean_subtree(self, node) -> list:
        if id(node.module) not in self._hooked:
            return [node]
        return [n for child in node.children for n in self._clean_subtree(child)]

    def _capture(self, first) -> "_Prefix":
        """The clean outputs of _prefix_calls(first) (those that are tensors or tuples / lists of
        them; others are recomputed), and which of their tensors anything outside the prefix reads
        (a torch function, metadata included, called while no prefix call runs): only those are
        tiled to the copies; the rest are handed back as they are, as nothing that runs reads them."""
        nodes = self._prefix_calls(first)
        wanted = {(id(n.module), n.call) for n in nodes}
        owner = (id(nodes[0].module), nodes[0].call) if nodes else None
        modules = {id(n.module): n.module for n in nodes}
        got, count, active, depth = defaultdict(dict), defaultdict(int), [], [0]
        produced, needed, alive = {}, set(), []           # id(original output tensor) -> its copy; ids read

        def pre(module, args):
            k = count[id(module)]
            count[id(module)] += 1
            mine = (id(module), k) in wanted
            active.append((k, mine))
            depth[0] += mine

        def post(module, args, out):
            k, mine = active.pop()
            depth[0] -= mine
            if mine and _tileable(out):
                # kept as copies: the forward may go on to write into its module outputs in place
                got[id(module)][k] = _copy(out, produced)
                alive.append(out)                         # so that no later tensor takes its id
                if (id(module), k) == owner:              # corrected in place by the rows hook
                    needed.update(id(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))

        class Reads(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if depth[0] == 0:
                    for t in tree_leaves((args, kwargs)):
                        if isinstance(t, torch.Tensor) and id(t) in produced:
                            needed.add(id(t))
                return func(*args, **kwargs)

        handles = []
        try:
            for m in modules.values():
                handles.append(m.register_forward_pre_hook(pre))
                handles.append(m.register_forward_hook(post))
            with Reads():
                self.readout(self.model(self.tokens))
        finally:
            for h in handles:
                h.remove()
        needed = {id(produced[i]) for i in needed}          # the originals read -> their kept copies
        return _Prefix({i: (modules[i], calls) for i, calls in got.items() if calls}, needed, self.B)

    def _probe(self) -> bool:
        """Whether batch rows stay independent through the model and readout: the clean tokens
        between two other sequences must give the clean logits."""
        uniq = torch.unique(self.tokens)
        alt = uniq.roll(1)[torch.searchsorted(uniq, self.tokens)] if len(uniq) > 1 else self.tokens
        try:
            out = self.readout(self.model(torch.cat([alt, self.tokens, alt])))
        except Exception:
            return False
        if not isinstance(out, torch.Tensor) or out.shape != (3 * self.B, *self.clean.shape[1:]):
            return False
        return self._agree(out[self.B:2 * self.B], self.clean)

    def _tol(self) -> float:
        return float(torch.finfo(self.clean.dtype).eps) ** 0.5 if self.clean.is_floating_point() else 1e-4

    def _scale(self) -> float:
        return max(1.0, float(self.clean.abs().max()))

    # ------------------------------------------------------------------ rows: running it
    def _rows_checked(self, name, param, idx) -> torch.Tensor:
        groups = self._by_live_use(name, param, idx)
        if len(groups) == 1:
            first, _ = groups[0]
            return self._rows_regime(name, param, idx, first)
        out = None
        for first, where in groups:                       # each regime batched apart, results in idx's order
            part = self._rows_regime(name, param, idx[where], first)
            if out is None:
                out = part.new_empty((len(idx), *part.shape[1:]))
            out[where] = part
        return out

    def _by_live_use(self, name, param, idx) -> list:
        """idx split by the first use that changes (_live_use): [(first, positions in idx)]; one
        group, all of idx, unless an embedding call leaves some of these weights' rows unread."""
        uses = self._uses.get(name, [])
        if not uses or uses[0].ids is None:
            return [(uses[0] if uses else None, slice(None))]
        rows = idx // param.shape[1]
        firsts = {}
        for row in torch.unique(rows).tolist():
            first = self._live_use(name, row)
            firsts.setdefault(None if first is None else first.start, (first, []))[1].append(row)
        if len(firsts) == 1:
            return [(next(iter(firsts.values()))[0], slice(None))]
        return [(first, torch.isin(rows, torch.tensor(members, device=rows.device)).nonzero().flatten())
                for first, members in firsts.values()]

    def _rows_regime(self, name, param, idx, first) -> torch.Tensor:
        out = self._rows_batched(name, param, idx, first)
        regime = (name, None if first is None else first.start)
        if regime not in self.checked and self.force != "rows":
            # the largest weight of the first batch against the naive loop: any use the trace
            # missed, or a layout the hooks misread, shows there first
            k = int(param.detach().reshape(-1)[idx].abs().argmax())
            want = self._naive(param, idx[k:k + 1])[0]
            if not self._agree(out[k], want):
                raise _Disagrees(name)
            self.checked.add(regime)
        return out

    def _rows_batched(self, name, param, idx, first) -> torch.Tensor:
        n = len(idx)
        if first is None:                                 # no use changes: the clean logits, exactly
            return self.clean.reshape(1, -1, self.V).expand(n, -1, -1).clone()
        out = None
        pos = 0
        # each parameter searches on its own, and apart for each first live use: reusing the prefix
        # makes a late layer's copies far cheaper than an early one's, and cheap copies batch further
        key = name if first is self._uses[name][0] else f"{name}@{first.start}"
        sizes = self._sizes.setdefault(key, _Sizes(self._cap))
        while pos < n:
            a, timed = sizes.next(n - pos, n)
            t0 = time.perf_counter()
            logits = self._rows(name, param, idx[pos:pos + a], first)
            if timed:
                sizes.record(a, self._elapsed(t0, logits))
            if a == n:
                return logits                             # one forward for the whole batch: no copy
            if out is None:
                out = logits.new_empty((n, *logits.shape[1:]))
            out[pos:pos + a] = logits
            pos += a
        return out

    def _reuse(self, prefix: "_Prefix", key: int, module, a: int):
        """A forward for `module` that returns its clean output for `a` copies at its prefix calls
        and runs as usual at the others."""
        run = module.forward                              # bound: the class's forward (or the instance's)
        calls = prefix.calls[key][1]
        count = [0]

        def forward(*args, **kwargs):
            k = count[0]
            count[0] += 1
            return prefix.output(key, k, a) if k in calls else run(*args, **kwargs)
        return forward

    def _rows(self, name, param, idx, first) -> torch.Tensor:
        a = len(idx)
        flat = param.detach().reshape(-1)
        w = flat[idx]
        ar = torch.arange(a, device=idx.device)
        rows_needed = a * self.B

        def per_copy(x, tail):
            """x as (a, rows of one copy, *tail): the copies' rows, or rows shared by every copy (the
            first call's clean input, not copied as nothing else reads it; a broadcast row)."""
            if x.shape[0] == rows_needed:
                return x.reshape(a, -1, *tail)
            if x.shape[0] == 1 and self.B > 1:
                x = x.expand(self.B, *x.shape[1:])
            if x.shape[0] == self.B:
                return x.reshape(1, -1, *tail).expand(a, -1, *tail)
            raise _NotRows(f"{name}: a module's input rows are not the batch's")

        def correct(kind, module):
            def hook(mod, args, kwargs, y):
                x = _input_of(args, kwargs)
                if not isinstance(y, torch.Tensor) or not isinstance(x, torch.Tensor) or x.ndim == 0 or y.ndim == 0:
                    raise _NotRows(f"{name}: a module's input or output is not a batch")
                if y.shape[0] == 1 and rows_needed > 1:
                    # one row broadcast over the batch (GPT-2's position ids (1, T)): each copy its own
                    y = y.expand(rows_needed, *y.shape[1:]).contiguous()
                if y.shape[0] != rows_needed:
                    raise _NotRows(f"{name}: a module's rows are not the batch's")
                xv = per_copy(x, () if kind == "embedding.weight" else (x.shape[-1],))
                F = y.shape[-1]
                yv = y.reshape(a, -1, F)
                ww = w.to(y.dtype)
                if kind in ("linear.weight", "conv1d.weight"):
                    if kind == "linear.weight":
                        i, j = idx // param.shape[1], idx % param.shape[1]
                    else:                                  # Conv1D: weight (in, out), y = x @ W + b
                        j, i = idx // param.shape[1], idx % param.shape[1]
                    yv[ar, :, i] = yv[ar, :, i] - ww[:, None] * xv[ar, :, j].to(y.dtype)
                elif kind in ("linear.bias", "conv1d.bias", "layernorm.bias"):
                    yv = y.reshape(a, -1, param.numel()) if kind == "layernorm.bias" else yv
                    yv[ar, :, idx] = yv[ar, :, idx] - ww[:, None]
                elif kind == "embedding.weight":
                    r, c = idx // param.shape[1], idx % param.shape[1]
                    col = yv[ar, :, c]
                    yv[ar, :, c] = torch.where(xv == r[:, None], torch.zeros((), dtype=y.dtype, device=y.device), col)
                elif kind == "layernorm.weight":
                    yv = y.reshape(a, -1, param.numel())
                    bias = mod.bias
                    fill = (bias.detach().reshape(-1)[idx].to(y.dtype) if bias is not None
                            else torch.zeros(a, dtype=y.dtype, device=y.device))
                    yv[ar, :, idx] = fill[:, None].expand(a, yv.shape[1])
                elif kind == "rmsnorm.weight":
                    yv = y.reshape(a, -1, param.numel())
                    yv[ar, :, idx] = torch.zeros((), dtype=y.dtype, device=y.device)
                else:                                      # pragma: no cover - _kind lists them all
                    raise _NotRows(kind)
                return yv.reshape(y.shape)
            return hook

        tokens = self._repeated.get(a)
        if tokens is None:
            tokens = self.tokens.repeat(a, 1) if a > 1 else self.tokens
            self._repeated = {a: tokens}                   # one size at a time: the last one used
        prefix = self._prefix.get((name, first.start))
        if prefix is None:                                # one parameter's at a time: a scan goes parameter by parameter
            if any(k[0] != name for k in self._prefix):
                self._prefix = {}
            prefix = self._prefix[(name, first.start)] = self._capture(first)
        handles = [m.register_forward_hook(correct(kind, m), with_kwargs=True) for m, kind in self._owners[name]]
        patched = []
        try:
            # the instance's own dict, not setattr: a TransformerBridge component passes attribute
            # writes on to the module it wraps (whose forward would then call the bridge's: a loop)
            for key, (module, _) in prefix.calls.items():     # reuse the clean outputs of the prefix
                patched.append((module, vars(module).get("forward")))
                vars(module)["forward"] = self._reuse(prefix, key, module, a)
            out = self.readout(self.model(tokens))
            prefix.after_forward()
        finally:
            for module, before in reversed(patched):
                if before is None:
                    vars(module).pop("forward", None)
                else:
                    vars(module)["forward"] = before
            for h in handles:
                h.remove()
        if not isinstance(out, torch.Tensor) or out.shape != (rows_needed, *self.clean.shape[1:]):
            raise _NotRows(f"{name}: the readout of {a} copies is not ({rows_needed}, T, V)")
        return out.reshape(a, -1, self.V)
