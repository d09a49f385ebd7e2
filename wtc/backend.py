"""The one kernel-backend selector: every fast path asks ``choose(op, tensor_or_device)``.

Backends: "triton" (wtc.kernels: the GPU path; CPU tensors only through the interpreter,
TRITON_INTERPRET=1), "native" (wtc._C, C++17/OpenMP: the CPU path) and "reference" (torch: always
complete, the oracle every other backend is tested against).

    op                         backends                   default (WTC_KERNELS unset)
    dt.route                   triton, native, reference  triton for CUDA tensors when triton imports;
      (pointer heads, every sampling mode;                  native for float32 CPU tensors (wtc.kernels.cpu;
       Triton: aggregate heads too)                         bench/dt_step.py --versus)
    dt.mlp_bank                triton, native, reference  same (the native op: wtc.kernels.cpu.mlp_bank, float32
                                                          and float64)
    dt.route_hard              native, reference          native for CPU tensors from NATIVE_MIN_POSITIONS
      (argmax routing of frozen heads in predict)             query positions (size=; None: no threshold)
    dt.gumbel                  native, reference          native on the CPU
    scan.kl_rows, kl_rank1     triton, native, reference  triton for CUDA tensors; native for float32 CPU
    scan.kl_unembed            native, reference          native for float32 CPU tensors
    scan.importance_positions  native, reference          same
    ace.gramian                native, reference          native (state on the CPU; GPU chunks: torch)
    sr.screen                  native, reference          native (the linear screen's loops, float64; the
                                                          reference is the numba kernels of wtc.sr.numba_eval,
                                                          whose import and cache load cost ~1 s a process)

WTC_KERNELS overrides:
  reference  the reference everywhere.
  triton     Triton for every op that has it, or a BackendError when it cannot run (triton not
             installed; CPU tensors without TRITON_INTERPRET=1); ops without a Triton kernel keep
             their default.
  native     wtc._C for every op that has it where the input fits (CPU, float32 where the table says
             so; no size threshold), a BackendError when wtc._C is not built; the reference
             everywhere else (never Triton: this setting tests the CPU build).
WTC_NATIVE_ISA (auto | avx512 | avx2 | portable): the instruction set of the native DT kernels
  (dt.route, dt.mlp_bank), read when wtc._C loads; one this CPU cannot run is a BackendError when
  they run (wtc._native.dt_isa), and `wtc backends` shows the choice.
An input that does not fit a backend (a CUDA tensor for native, float64 for a float32 kernel) gets
the reference; a float64 input keeps its precision.

Decided 2026-12 (backend consolidation):
- wtc._C_cuda (csrc/cuda: argmax routing on device pointers) is removed. Nothing called it; on a
  GPU the same op, the frozen heads' hard routing, already runs through the Triton route kernel
  (hard=True, no noise), and the house rule is one implementation of each idea, Triton being the
  GPU path. Build options WTC_CUDA / WTC_CUDA_ARCHITECTURES went with it.
- wtc._C.ple_encode is removed: no path needs a standalone, non-differentiable PLE. The DT encodes
  in torch (autograd) or inside the fused kernels (route_hard, the Triton route), and route_hard's
  tests check its encoding against the torch ple().
"""
from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass

from wtc import _native
from wtc.errors import BackendError, BackendNameError

KERNEL_CHOICES = ("reference", "triton", "native")

# Hard routing through wtc._C pays off from about 10^4 query positions per call: bench/native_route.py
# measured 0.92x at 1000 sequences x 10 positions, 1.2x at 10^5 positions and 2.4-3.9x at 64 positions.
NATIVE_MIN_POSITIONS = 20_000


@dataclass(frozen=True)
class _Op:
    backends: tuple[str, ...]        # besides the reference, in order of preference
    float32: bool = False            # the native kernel takes float32 inputs only
    float64: bool = False            # ... or float64 ones (every operand the same dtype)
    min_size: int = 0                # native from this many units of work (size=) per call


OPS = {
    "dt.route": _Op(("triton", "native"), float32=True),
    "dt.mlp_bank": _Op(("triton", "native"), float32=True, float64=True),
    "dt.route_hard": _Op(("native",), min_size=NATIVE_MIN_POSITIONS),
    "dt.gumbel": _Op(("native",)),
    "scan.kl_rows": _Op(("triton", "native"), float32=True),
    "scan.kl_rank1": _Op(("triton", "native"), float32=True),
    "scan.kl_unembed": _Op(("native",), float32=True),
    "scan.importance_positions": _Op(("native",), float32=True),
    "ace.gramian": _Op(("native",)),
    "sr.screen": _Op(("native",)),
}


def override() -> str | None:
    """The WTC_KERNELS override (reference | triton | native), validated; None when unset."""
    value = os.environ.get("WTC_KERNELS", "").strip().lower()
    if not value:
        return None
    if value not in KERNEL_CHOICES:
        raise BackendNameError(f"WTC_KERNELS={value!r} is not one of {', '.join(KERNEL_CHOICES)} "
                               "(unset it to let wtc choose per op)")
    return value


@functools.lru_cache(maxsize=None)
def triton_status() -> tuple[bool, str]:
    """(importable, why not)."""
    try:
        importlib.import_module("triton")
        return True, ""
    except ImportError as exc:
        return False, f"triton is not installed ({exc})"


def interpreting() -> bool:
    """Whether Triton runs as its interpreter (TRITON_INTERPRET=1: CPU tensors, slow, for testing)."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def require_native(who: str = "WTC_KERNELS=native"):
    """wtc._C, or a BackendError saying that `who` asked for it and why it cannot be imported."""
    mod = _native.cpu_module()
    if mod is None:
        raise BackendError(f"{who} but wtc._C is not importable: {_native.import_error()}")
    return mod


def _device_type(where) -> str:
    device = getattr(where, "device", where)          # a tensor, a torch.device or a string
    return "cpu" if device is None else str(getattr(device, "type", device)).split(":")[0]


def _fits_float32(where, dtype, float64: bool = False) -> bool:
    """Whether every operand dtype (default: where's; a bare device: assumed float32) is float32
    (or, with float64=True, every one is float64)."""
    if dtype is None:
        dtype = getattr(where, "dtype", None)
    dtypes = [d for d in (dtype if isinstance(dtype, (tuple, list)) else (dtype,)) if d is not None]
    if not dtypes:
        return True
    import torch        # already loaded when a dtype came in; `import wtc` itself stays torch-free
    return all(d == torch.float32 for d in dtypes) or (float64 and all(d == torch.float64 for d in dtypes))


def choose(op: str, where, *, size: int | None = None, dtype=None) -> str:
    """The backend that runs `op` on `where` (a tensor, a device or a device string): "triton",
    "native" or "reference". size: units of work for ops with a threshold (dt.route_hard: query
    positions; None: no threshold). dtype: the dtype(s) of every operand a float32 kernel reads
    (default: where's). Raises BackendError when WTC_KERNELS forces a backend that cannot run, and
    BackendNameError for a bad WTC_KERNELS value or an unknown op."""
    spec = OPS.get(op)
    if spec is None:
        raise BackendNameError(f"unknown op {op!r}; ops: {', '.join(OPS)}")
    forced = override()
    if forced == "reference":
        return "reference"
    device = _device_type(where)
    # triton is looked up only where it could run: importing it to learn that costs 0.3 s, which a
    # discover worker paid on its first CPU op (measured)
    if "triton" in spec.backends and (forced == "triton" or (forced is None and device == "cuda")):
        ok, why = triton_status()
        if forced == "triton":
            if not ok:
                raise BackendError(f"WTC_KERNELS=triton but {why}")
            if device != "cuda" and not interpreting():
                raise BackendError("WTC_KERNELS=triton on CPU tensors needs TRITON_INTERPRET=1 (the Triton "
                                   "interpreter), set before wtc.kernels runs its first op")
            return "triton"
        if ok and device == "cuda":
            return "triton"
    if ("native" in spec.backends and device == "cpu" and (not spec.float32 or _fits_float32(where, dtype, spec.float64))
            and (forced == "native" or size is None or size >= spec.min_size)):
        if forced == "native":
            require_native()
            return "native"
        if _native.cpu_module() is not None:
            return "native"
    return "reference"


def plan(where="cpu") -> dict[str, str]:
    """{op: what choose() picks now for float32 work on `where`, without size threshold}; an op whose
    forced backend cannot run maps to "error: <why>"."""
    out = {}
    for op in OPS:
        try:
            out[op] = choose(op, where)
        except BackendError as exc:
            out[op] = f"error: {exc}"
    return out


@dataclass(frozen=True)
class Backend:
    name: str
    built: bool
    usable: bool
    why: str
    ops: tuple[str, ...] = ()        # "op@device" it would run now (see plan)

    def __str__(self) -> str:
        state = "usable" if self.usable else ("built, not usable" if self.built else "not built")
        now = f"  now: {', '.join(self.ops)}" if self.ops else ""
        return f"{self.name:12s} {state:18s} {self.why}{now}"


def backends() -> list[Backend]:
    """cpu-native and triton: whether each was built, whether it can run here, why, and the ops it
    would run now (on CPU tensors, and CUDA tensors when a GPU is visible)."""
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    plans = {dev: plan(dev) for dev in (("cpu", "cuda") if has_gpu else ("cpu",))}

    def ops(choice):
        return tuple(f"{op}@{dev}" for dev, p in plans.items() for op, c in p.items() if c == choice)

    cpu = _native.cpu_module()
    if cpu is None:
        native = Backend("cpu-native", False, False, f"wtc._C failed to import: {_native.import_error()}")
    else:
        native = Backend("cpu-native", True, True, f"OpenMP, {cpu.num_threads()} threads, DT kernels "
                         f"{_native.dt_isa_report()}", ops("native"))
    return [native, _triton_backend(has_gpu, ops("triton"))]


def _triton_backend(has_gpu: bool, ops: tuple[str, ...]) -> Backend:
    ok, why = triton_status()
    if not ok:
        return Backend("triton", False, False, why)
    version = getattr(importlib.import_module("triton"), "__version__", "?")
    if interpreting():
        return Backend("triton", True, True, f"triton {version} in interpreter mode (CPU tensors)", ops)
    if has_gpu:
        return Backend("triton", True, True, f"triton {version}, CUDA device available", ops)
    return Backend("triton", True, False, f"triton {version} installed, but no GPU (set TRITON_INTERPRET=1 to interpret)")
