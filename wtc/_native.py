"""Loading of the native modules and the backend report.

``wtc._C`` (C++/OpenMP) is always built; ``wtc._C_cuda`` only when a CUDA compiler was found at
build time. Nothing here is imported eagerly by ``import wtc``: the first call loads the module.
"""
from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass

KERNEL_CHOICES = ("reference", "triton", "native")


@dataclass(frozen=True)
class Backend:
    name: str
    built: bool
    usable: bool
    why: str

    def __str__(self) -> str:
        state = "usable" if self.usable else ("built, not usable" if self.built else "not built")
        return f"{self.name:12s} {state:18s} {self.why}"


@functools.lru_cache(maxsize=None)
def _load(name: str):
    """Import wtc.<name>; returns (module or None, error message)."""
    try:
        return importlib.import_module(f"wtc.{name}"), ""
    except ImportError as exc:
        return None, str(exc)


def cpu_module():
    """wtc._C, or None when the package was not built (e.g. a source checkout on sys.path)."""
    return _load("_C")[0]


def cuda_module():
    """wtc._C_cuda when it was built and a CUDA device is visible, else None."""
    mod = _load("_C_cuda")[0]
    if mod is None or mod.device_count() == 0:
        return None
    return mod


def kernels_override() -> str | None:
    """The WTC_KERNELS override (reference | triton | native), validated."""
    value = os.environ.get("WTC_KERNELS", "").strip().lower()
    if not value:
        return None
    if value not in KERNEL_CHOICES:
        raise ValueError(f"WTC_KERNELS={value!r} is not one of {', '.join(KERNEL_CHOICES)}")
    return value


# Hard routing through wtc._C pays off from about 10^4 query positions per call: bench/native_route.py
# measured 0.92x at 1000 sequences x 10 positions, 1.2x at 10^5 positions and 2.4-3.9x at 64 positions.
NATIVE_MIN_POSITIONS = 20_000


def use_native_cpu(positions: int | None = None) -> bool:
    """Whether CPU-side hard routing of `positions` query positions should go through wtc._C:
    WTC_KERNELS=native forces it, =reference forbids it, otherwise when built and large enough."""
    choice = kernels_override()
    if choice == "reference":
        return False
    if choice == "native":
        if cpu_module() is None:
            raise RuntimeError(f"WTC_KERNELS=native but wtc._C is not importable: {_load('_C')[1]}")
        return True
    return cpu_module() is not None and (positions is None or positions >= NATIVE_MIN_POSITIONS)


def backends() -> list[Backend]:
    """Each backend, whether it was built, whether it can run here, and why not."""
    out = []
    cpu, err = _load("_C")
    if cpu is None:
        out.append(Backend("cpu-native", False, False, f"wtc._C failed to import: {err}"))
    else:
        out.append(Backend("cpu-native", True, True, f"OpenMP, {cpu.num_threads()} threads"))

    cuda, err = _load("_C_cuda")
    if cuda is None:
        why = ("not built (no CUDA compiler at build time, or WTC_CUDA=OFF)"
               if "No module named" in err else f"failed to import: {err}")
        out.append(Backend("cuda-native", False, False, why))
    else:
        n = cuda.device_count()
        out.append(Backend("cuda-native", True, n > 0,
                           f"{n} CUDA device(s)" if n else "built, but no CUDA device/driver visible"))

    out.append(_triton_backend())
    return out


def _triton_backend() -> Backend:
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return Backend("triton", False, False, f"triton not installed: {exc}")
    version = getattr(triton, "__version__", "?")
    if os.environ.get("TRITON_INTERPRET") == "1":
        return Backend("triton", True, True, f"triton {version} in interpreter mode (CPU tensors)")
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return Backend("triton", True, True, f"triton {version}, CUDA device available")
    return Backend("triton", True, False, f"triton {version} installed, but no GPU (set TRITON_INTERPRET=1 to interpret)")
