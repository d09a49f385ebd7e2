"""wtc.backend: the selector's decision for every op under every WTC_KERNELS value, its errors, and
the backends() report. The selector only looks at the device type and dtypes, so CUDA decisions are
checked here through the device string "cuda" on any machine."""
import pytest
import torch

import wtc
from wtc import _native, backend
from wtc.backend import NATIVE_MIN_POSITIONS, OPS, choose
from wtc.errors import BackendError, BackendNameError, WtcError

C = _native.cpu_module()
needs_native = pytest.mark.skipif(C is None, reason="wtc._C not built")
has_triton = backend.triton_status()[0]
needs_triton = pytest.mark.skipif(not has_triton, reason="triton not installed")

CPU32, CPU64 = torch.zeros(1), torch.zeros(1, dtype=torch.float64)
WHERE = {"cpu32": (CPU32, None), "cpu64": (CPU64, None), "cuda32": ("cuda", torch.float32),
         "cuda64": ("cuda", torch.float64)}

# op -> backend on (cpu32, cpu64, cuda32, cuda64), with wtc._C built and triton installed; size=None
T, N, R = "triton", "native", "reference"
EXPECTED = {
    None: {
        "dt.route": (N, R, T, T), "dt.mlp_bank": (N, N, T, T),
        "dt.route_hard": (N, N, R, R), "dt.gumbel": (N, N, R, R), "ace.gramian": (N, N, R, R), "sr.screen": (N, N, R, R),
        "scan.kl_rows": (N, R, T, T), "scan.kl_rank1": (N, R, T, T),
        "scan.kl_unembed": (N, R, R, R), "scan.importance_positions": (N, R, R, R),
    },
    "reference": {op: (R, R, R, R) for op in OPS},
    "triton": {   # under TRITON_INTERPRET=1; ops without a Triton kernel keep their default
        "dt.route": (T, T, T, T), "dt.mlp_bank": (T, T, T, T),
        "dt.route_hard": (N, N, R, R), "dt.gumbel": (N, N, R, R), "ace.gramian": (N, N, R, R), "sr.screen": (N, N, R, R),
        "scan.kl_rows": (T, T, T, T), "scan.kl_rank1": (T, T, T, T),
        "scan.kl_unembed": (N, R, R, R), "scan.importance_positions": (N, R, R, R),
    },
    "native": {   # never Triton; the reference where the input does not fit wtc._C
        "dt.route": (N, R, R, R), "dt.mlp_bank": (N, N, R, R),
        "dt.route_hard": (N, N, R, R), "dt.gumbel": (N, N, R, R), "ace.gramian": (N, N, R, R), "sr.screen": (N, N, R, R),
        "scan.kl_rows": (N, R, R, R), "scan.kl_rank1": (N, R, R, R),
        "scan.kl_unembed": (N, R, R, R), "scan.importance_positions": (N, R, R, R),
    },
}


def _set_kernels(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("WTC_KERNELS", raising=False)
    else:
        monkeypatch.setenv("WTC_KERNELS", value)


def test_the_table_covers_every_op():
    for value, table in EXPECTED.items():
        assert set(table) == set(OPS), value


@needs_native
@needs_triton
@pytest.mark.parametrize("value", list(EXPECTED))
def test_decision_per_op_and_override(monkeypatch, value):
    _set_kernels(monkeypatch, value)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for op, want in EXPECTED[value].items():
        got = tuple(choose(op, where, dtype=dtype) for where, dtype in WHERE.values())
        assert got == want, (value, op)


@needs_native
@needs_triton
def test_triton_on_cpu_tensors_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("WTC_KERNELS", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for op, spec in OPS.items():
        if "triton" in spec.backends:
            with pytest.raises(BackendError, match="TRITON_INTERPRET=1"):
                choose(op, CPU32)
            assert choose(op, "cuda") == "triton"
        else:
            assert choose(op, CPU32) == EXPECTED[None][op][0]
    assert isinstance(BackendError("x"), RuntimeError) and isinstance(BackendError("x"), WtcError)


def test_dispatch(monkeypatch):
    """(moved from test_kernels.py, where it asked kernels.use_triton)"""
    cpu = torch.zeros(1)
    monkeypatch.delenv("WTC_KERNELS", raising=False)
    # float32 CPU tensors: the native fused op when wtc._C is built, float64 keeps the reference
    assert choose("dt.route", cpu) == ("native" if C is not None else "reference")
    assert choose("dt.route", cpu.double()) == "reference"
    monkeypatch.setenv("WTC_KERNELS", "reference")
    assert choose("dt.route", cpu) == "reference"
    if torch.cuda.is_available():
        assert choose("dt.route", torch.zeros(1, device="cuda")) == "reference"
    if has_triton:
        monkeypatch.setenv("WTC_KERNELS", "triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        assert choose("dt.route", cpu) == "triton"
        monkeypatch.delenv("TRITON_INTERPRET")
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            choose("dt.route", cpu)
    monkeypatch.setenv("WTC_KERNELS", "fastest")
    with pytest.raises(ValueError, match="WTC_KERNELS"):
        choose("dt.route", cpu)
    if torch.cuda.is_available() and has_triton:
        monkeypatch.delenv("WTC_KERNELS")
        assert choose("dt.route", torch.zeros(1, device="cuda")) == "triton"


@needs_native
def test_native_routing_is_chosen_by_size_and_override(monkeypatch):
    """(moved from test_native.py, where it asked _native.use_native_cpu)"""
    monkeypatch.delenv("WTC_KERNELS", raising=False)
    assert choose("dt.route_hard", CPU32, size=100) == "reference"
    assert choose("dt.route_hard", CPU32, size=10 * NATIVE_MIN_POSITIONS) == "native"
    assert choose("dt.route_hard", CPU32, size=NATIVE_MIN_POSITIONS) == "native"
    monkeypatch.setenv("WTC_KERNELS", "native")
    assert choose("dt.route_hard", CPU32, size=1) == "native"
    monkeypatch.setenv("WTC_KERNELS", "reference")
    assert choose("dt.route_hard", CPU32, size=10**9) == "reference"
    monkeypatch.setenv("WTC_KERNELS", "triton")                  # no Triton kernel: the size rule holds
    assert choose("dt.route_hard", CPU32, size=100) == "reference"
    assert choose("dt.route_hard", "cuda", size=10**9) == "reference"


@needs_native
def test_every_operand_dtype_counts_for_a_float32_kernel(monkeypatch):
    monkeypatch.delenv("WTC_KERNELS", raising=False)
    assert choose("scan.kl_rank1", CPU32, dtype=(torch.float32, torch.float32)) == "native"
    assert choose("scan.kl_rank1", CPU32, dtype=(torch.float32, torch.float64)) == "reference"
    assert choose("scan.kl_unembed", CPU32, dtype=torch.float64) == "reference"
    assert choose("dt.route_hard", CPU64) == "native"            # it converts: no dtype rule
    assert choose("dt.gumbel", None) == "native"                  # device None: the CPU


@pytest.mark.parametrize("value", ["fast", "cuda", "yes"])
def test_bad_override_is_one_line_naming_the_variable_and_the_choices(monkeypatch, value):
    """(test_kernels_override_is_validated moved from test_native.py, extended)"""
    monkeypatch.setenv("WTC_KERNELS", value)
    with pytest.raises(ValueError, match=f"WTC_KERNELS='{value}'") as info:
        backend.override()
    for op in OPS:
        with pytest.raises(BackendNameError):
            choose(op, CPU32)
    msg = str(info.value)
    assert isinstance(info.value, WtcError) and "\n" not in msg
    assert all(choice in msg for choice in ("reference", "triton", "native"))


def test_unknown_op_names_the_ops():
    with pytest.raises(BackendNameError, match="scan.kl_rows"):
        choose("dt.rout", CPU32)


def test_forced_native_without_the_build_is_an_error_only_where_it_would_run(monkeypatch):
    monkeypatch.setattr(_native, "cpu_module", lambda: None)
    monkeypatch.setattr(_native, "import_error", lambda: "no module named wtc._C (test)")
    monkeypatch.delenv("WTC_KERNELS", raising=False)
    assert all(choose(op, CPU32) in ("reference", "triton") for op in OPS)   # unbuilt: the reference
    monkeypatch.setenv("WTC_KERNELS", "native")
    with pytest.raises(BackendError, match=r"WTC_KERNELS=native but wtc._C is not importable: no module"):
        choose("scan.kl_rows", CPU32)
    assert choose("scan.kl_rows", CPU64) == "reference"          # would not run there anyway
    assert choose("dt.gumbel", "cuda") == "reference"
    from wtc.ace import GramianAccumulator
    with pytest.raises(BackendError, match="backend='native'"):
        GramianAccumulator(3, backend="native")
    from wtc.scan.kl import kl_rows
    with pytest.raises(BackendError, match="WTC_KERNELS=native"):
        kl_rows(torch.zeros(2, 3, dtype=torch.float64), torch.zeros(1, 2, 3))


def test_forced_triton_without_triton_is_an_error(monkeypatch):
    monkeypatch.setattr(backend, "triton_status", lambda: (False, "triton is not installed (test)"))
    monkeypatch.delenv("WTC_KERNELS", raising=False)
    assert choose("dt.route", "cuda") == "reference"
    assert choose("scan.kl_rows", "cuda") == "reference"
    monkeypatch.setenv("WTC_KERNELS", "triton")
    with pytest.raises(BackendError, match="WTC_KERNELS=triton but triton is not installed"):
        choose("dt.mlp_bank", "cuda")
    (triton,) = [b for b in backend.backends() if b.name == "triton"]
    assert not triton.built and not triton.usable and "not installed" in triton.why


def test_backends_report():
    """(moved from test_native.py; wtc._C_cuda is gone, so two backends)"""
    names = [b.name for b in wtc.backends()]
    assert names == ["cpu-native", "triton"]
    for b in wtc.backends():
        assert b.why and (b.built or not b.usable)
        assert "\n" not in str(b)


@needs_native
def test_backends_say_what_runs_now(monkeypatch):
    monkeypatch.delenv("WTC_KERNELS", raising=False)
    (native,) = [b for b in backend.backends() if b.name == "cpu-native"]
    assert native.built and native.usable
    assert {"dt.gumbel@cpu", "scan.kl_rows@cpu", "ace.gramian@cpu"} <= set(native.ops)
    assert {"dt.route@cpu", "dt.mlp_bank@cpu"} <= set(native.ops) and "now:" in str(native)
    monkeypatch.setenv("WTC_KERNELS", "reference")
    assert all(not b.ops for b in backend.backends())
    assert set(backend.plan("cpu").values()) == {"reference"}


def test_backends_report_a_missing_build(monkeypatch):
    monkeypatch.setattr(_native, "cpu_module", lambda: None)
    monkeypatch.setattr(_native, "import_error", lambda: "undefined symbol: omp_foo (test)")
    (native,) = [b for b in backend.backends() if b.name == "cpu-native"]
    assert not native.built and not native.usable and "omp_foo" in native.why and not native.ops


@needs_triton
def test_plan_reports_a_forced_backend_that_cannot_run(monkeypatch):
    monkeypatch.setenv("WTC_KERNELS", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    p = backend.plan("cpu")
    assert set(p) == set(OPS)
    assert p["dt.route"].startswith("error: ") and "TRITON_INTERPRET" in p["dt.route"]
    assert backend.plan("cuda")["dt.route"] == "triton"


def test_choosing_for_cpu_work_does_not_import_triton():
    """Triton can run only on a GPU (or under its interpreter, asked for by name): deciding a CPU
    op must not import it (0.3 s of every discover worker's first step, measured)."""
    import subprocess
    import sys
    code = ("import sys, torch; from wtc import backend; "
            "print([backend.choose(op, torch.zeros(1)) for op in backend.OPS]); "
            "assert 'triton' not in sys.modules, 'triton imported'")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("WTC_KERNELS", "TRITON_INTERPRET")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-500:]
