"""Every Triton kernel, launched as wtc launches it, compiles for a real GPU (sm_90): checked here,
on a machine without one (tests/kernel_aot.py says why the interpreter alone is not enough).

The launchers run under the interpreter (conftest) in every mode the DT and the scan use — soft,
soft with noise and overlaps, hard straight-through, hard eval; every sub-MLP activation, indexed
and weighted reads, one and two hidden layers; the aggregate heads; both KL kinds — forward and
backward. Each distinct launch (kernel, argument types, constexprs) is then compiled to a cubin in
a fresh process with the interpreter off.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
interpreter = pytest.importorskip("triton.runtime.interpreter")
if not hasattr(interpreter, "InterpretedFunction"):
    pytest.skip("this Triton has no interpreter to record launches with", allow_module_level=True)

import kernel_aot  # noqa: E402  (tests/ is on sys.path under pytest's rootdir conftest)

from wtc import kernels  # noqa: E402
from wtc.scan import kl as K  # noqa: E402

HERE = Path(__file__).resolve().parent


def _ptxas_available() -> bool:
    try:
        from triton.backends.nvidia import compiler as nv
        return bool(nv.get_ptxas(90).path)
    except Exception:
        return False


def _launches(monkeypatch) -> list[dict]:
    """Run every launcher once per mode under the interpreter; the distinct launches it made."""
    seen = {}
    original = interpreter.InterpretedFunction.run

    def recording(self, *args, grid, warmup, **kwargs):
        rec = kernel_aot.record(self, args, kwargs)
        seen.setdefault(json.dumps(rec, sort_keys=True), rec)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(interpreter.InterpretedFunction, "run", recording)
    g = torch.Generator().manual_seed(0)
    f = lambda *s: torch.randn(*s, generator=g)            # noqa: E731
    u01 = lambda *s: torch.rand(*s, generator=g)           # noqa: E731

    def backward(*outs):
        sum((o * torch.randn(o.shape, generator=g)).sum() for o in outs if o is not None and o.requires_grad).backward()

    modes = [(False, False, False, False), (False, False, True, True), (True, True, True, False),
             (True, False, False, False)]
    # a general shape, and the degenerate one (sizes of 1 are compiled as constants, as launched)
    for (R, B, H, T, pad, N), (hard, st, noise, overlap) in [((1, 2, 2, 5, 3, 5), m) for m in modes] + \
            [((2, 1, 1, 1, 0, 1), m) for m in modes if not m[3]]:
        L = T + pad
        leaves = [t.requires_grad_() for t in (u01(R, B, H, T), u01(R, B, H, L), f(R, B, H, L), 0.3 * f(R, H, N, N),
                                               0.3 * f(R, H, N), f(R, H, L), f(R, H, L), u01(R, H) + 0.5)]
        out, o_rows = kernels.route(*leaves, torch.ones(R), pad=pad, tau=0.7, hard=hard, straight_through=st,
                                    seed=123 if noise else None, overlap=overlap)
        backward(out, o_rows)
    val = f(2, 7).requires_grad_()
    backward(kernels.aggregate(val))
    Rb, n, V, M, k, hidden = 1, 9, 4, 2, 2, 6
    for activation in ("relu+silu", "relu", "silu", "gelu", "tanh"):
        for indexed in (False, True):
            for depth in (1, 2):
                select = torch.randint(0, V, (Rb, M * k), generator=g) if indexed else \
                    torch.softmax(f(Rb, M * k, V), -1).requires_grad_()
                params = [f(Rb, M, hidden, k), f(Rb, M, hidden), f(Rb, M, hidden), f(Rb, M), f(Rb, M, k)]
                if depth == 2:
                    params += [f(Rb, M, hidden, hidden) / hidden ** 0.5, f(Rb, M, hidden)]
                params = [p.requires_grad_() for p in params]
                stream = f(Rb, n, V).requires_grad_()
                backward(kernels.mlp_bank(stream, select, *params[:5], activation, *params[5:]))
    monkeypatch.setenv("WTC_KERNELS", "triton")
    logits = f(3, 40) * 4
    logp = torch.log_softmax(logits.double(), -1)
    K.kl_rows(logp, logits[None] + f(5, 3, 40))
    K.kl_rank1(logp, logits, f(5, 3), f(5, 40))
    logits = f(2, 1100)                                    # past one chunk: the chunked kernel
    logp = torch.log_softmax(logits.double(), -1)
    K.kl_rows(logp, logits[None] + f(3, 2, 1100))
    K.kl_rank1(logp, logits, f(3, 2), f(3, 1100))
    return list(seen.values())


@pytest.mark.skipif(not _ptxas_available(), reason="Triton's ptxas is not available to compile for a GPU")
def test_every_kernel_compiles_for_hopper(monkeypatch, tmp_path):
    records = _launches(monkeypatch)
    names = {r["name"] for r in records}
    assert {"_route_fwd", "_route_bwd", "_route_overlap", "_aggregate_fwd", "_aggregate_bwd",
            "_bank_fwd", "_bank_bwd", "_kl_kernel"} <= names, names
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(records))
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "WTC_KERNELS")}
    proc = subprocess.run([sys.executable, str(HERE / "kernel_aot.py"), str(path), "--arch", "90"],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    failed = [f"{r['kernel']} {r['constexprs']}: {r['error']}" for r in results if not r["ok"]]
    assert not failed, "\n\n".join(failed)
    assert len(results) == len(records)


def test_a_type_changing_loop_variable_is_caught(tmp_path):
    """The check itself: the bug class it exists for (a name re-bound in a loop with another type)
    fails to compile with the compiler's own message."""
    if not _ptxas_available():
        pytest.skip("Triton's ptxas is not available")
    bad = tmp_path / "bad_kernel.py"
    bad.write_text(
        "import triton\nimport triton.language as tl\n\n\n"
        "@triton.jit\ndef bad(x_ptr, n, BLOCK: tl.constexpr):\n"
        "    i = tl.arange(0, BLOCK)\n    _ = i < n\n"
        "    for j in range(0, n):\n        _ = tl.load(x_ptr + i, mask=i < n, other=0.0)\n"
        "    tl.store(x_ptr + i, tl.zeros((BLOCK,), tl.float32), mask=i < n)\n")
    rec = {"module": "bad_kernel", "name": "bad",
           "args": {"x_ptr": ["ptr", "*fp32"], "n": ["scalar", 5], "BLOCK": ["scalar", 16]}}
    path = tmp_path / "launches.json"
    path.write_text(json.dumps([rec]))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(HERE / "kernel_aot.py"), str(path)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 1
    (result,) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["ok"] and "Loop-carried variable" in result["error"]
