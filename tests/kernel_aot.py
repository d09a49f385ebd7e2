"""Compile recorded Triton launches for a real GPU target, without a GPU (helper of test_kernels_aot).

The test suite runs wtc's kernels under Triton's interpreter, which executes them as numpy and so
misses what only the compiler checks: a loop-carried variable whose type changes, a tile shape
tl.dot refuses, an op the backend cannot lower. The interpreter cannot even build one wrong type
into an error (a `_` reused for a mask and then a float compiled nowhere, and nothing failed here).
So the test records each launch's argument kinds under the interpreter (record), and this script,
run in a process without TRITON_INTERPRET, compiles every distinct signature down to a cubin for
sm_90 (Hopper) with the ptxas Triton ships:

    python tests/kernel_aot.py launches.json [--arch 90]   -> prints a JSON report, exit 1 on a failure
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

_DTYPES = {"float32": "fp32", "float64": "fp64", "float16": "fp16", "bfloat16": "bf16", "int64": "i64",
           "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}


def describe(value) -> list:
    """An argument as [kind, payload]: a tensor's pointer type, or a scalar with its value (the value
    is kept for constexpr parameters; the compiler sees only the type of the others)."""
    import torch

    if isinstance(value, torch.Tensor):
        return ["ptr", "*" + _DTYPES[str(value.dtype).removeprefix("torch.")]]
    if isinstance(value, bool):
        return ["scalar", value]
    if isinstance(value, (int, float, str)) or value is None:
        return ["scalar", value]
    raise TypeError(f"cannot describe a kernel argument of type {type(value).__name__}")


def record(fn, args, kwargs) -> dict:
    """One launch of an interpreted kernel `fn` as a JSON-able record."""
    names = list(fn.arg_names)
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return {"module": fn.fn.__module__, "name": fn.fn.__name__,
            "args": {k: describe(v) for k, v in bound.items() if k in names}}


def _scalar_type(v) -> str:
    if isinstance(v, bool):
        return "i1"
    if isinstance(v, int):
        return "i32" if -2**31 <= v < 2**31 else "i64"
    if isinstance(v, float):
        return "fp32"
    raise TypeError(f"a non-constexpr argument {v!r} has no Triton type")


def source(rec: dict):
    """The ASTSource of a record (and its constexprs): constexpr parameters carry their values, the
    rest their types."""
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(rec["module"]), rec["name"])
    signature, constants = {}, {}
    for p in fn.params:
        kind, payload = rec["args"][p.name]
        # as the launcher does: an integer argument equal to 1 is compiled as the constant 1
        # unless the kernel says not to specialise it
        one = kind == "scalar" and type(payload) is int and payload == 1 and not p.do_not_specialize
        if p.is_constexpr or one:
            signature[p.name], constants[p.name] = "constexpr", payload
        else:
            signature[p.name] = payload if kind == "ptr" else _scalar_type(payload)
    return ASTSource(fn, signature, constants), constants


def compile_all(records: list[dict], arch: int = 90) -> list[dict]:
    """Compile each distinct record to a cubin for cuda:arch; one result per record."""
    import triton
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", arch, 32)
    results = []
    for rec in records:
        t0 = time.perf_counter()
        constants = {}
        try:
            src, constants = source(rec)
            kernel = triton.compile(src, target=target)
            ok, error = "cubin" in kernel.asm and len(kernel.asm["cubin"]) > 0, None
        except Exception as exc:           # the compiler's own error, reported with its kernel
            ok, error = False, f"{type(exc).__name__}: {exc}"[:2000]
        results.append({"kernel": f"{rec['module']}.{rec['name']}", "ok": ok, "error": error,
                        "constexprs": constants,
                        "seconds": round(time.perf_counter() - t0, 2)})
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("launches")
    ap.add_argument("--arch", type=int, default=90)
    args = ap.parse_args()
    with open(args.launches) as f:
        records = json.load(f)
    results = compile_all(records, args.arch)
    print(json.dumps(results))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
