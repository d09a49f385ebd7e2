"""Attention Gumbel noise on the CPU: torch.rand (what the DT drew before the counter-based noise),
the counter-based hash as a torch expression, and the same hash fused in wtc._C. Median ms per
call at DT training shapes (R, B, H, T, L), one thread, side by side.

    python -m bench.noise
"""
import time

import torch

from wtc.dt.gumbel import gumbel_hash
from wtc.dt.selection import gumbel_like


def median_ms(fn, reps: int = 20, rounds: int = 7) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t0) / reps)
    return sorted(times)[rounds // 2] * 1e3


def main() -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    for shape in [(8, 128, 3, 10, 19), (8, 128, 3, 32, 63)]:
        x = torch.zeros(shape)
        res = {"torch.rand": median_ms(lambda: gumbel_like(x, g)),
               "hash torch": median_ms(lambda: gumbel_hash(123, shape, native=False)),
               "hash native": median_ms(lambda: gumbel_hash(123, shape, native=True))}
        base = res["torch.rand"]
        print(shape, "  ".join(f"{k} {v:.3f} ms ({base / v:.2f}x)" for k, v in res.items()))


if __name__ == "__main__":
    main()
