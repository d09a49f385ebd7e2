"""Counter-based Gumbel noise for attention: a value per (seed, head instance, query, key).

Noise drawn from a generator has to be stored for the backward pass; noise that is a pure function
of (seed, position) can be regenerated where it is needed instead, which is what the fused routing
kernel (wtc/kernels/route.py) does. This is the torch twin of its `_gumbel`: both hash with the
murmur3 32-bit finaliser in uint32 arithmetic (here int64 masked to 32 bits), so the reference
attention and the kernel see bit-identical uniforms.

    key  = fmix32(stream * 0x9E3779B9 + seed)        stream = (r * B + b) * H + h
    bits = fmix32(key ^ (i * L + j))                  query i, key position j
    u    = ((bits >> 9) + 0.5) / 2^23                 in (0, 1), exact in float32 (23 bits: with 24,
                                                      the top value + 0.5 rounds to 2^24 and u = 1)
    g    = -log(-log(u))
"""
from __future__ import annotations

import torch

from wtc import _native
from wtc.backend import choose

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's finaliser on uint32 values held in int64 (products wrap mod 2^64; the low 32 bits
    are those of the uint32 product)."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


def draw_seed(generator: torch.Generator | None) -> int:
    """One 31-bit noise seed per forward call, from the run's generator (or the global one)."""
    device = generator.device if generator is not None else None
    return int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=device).item())


def gumbel_hash(seed: int, shape: tuple[int, int, int, int, int], device=None,
                dtype=torch.float32, native: bool | None = None) -> torch.Tensor:
    """Gumbel noise of shape (R, B, H, T, L), deterministic in (seed, index).

    On the CPU wtc._C computes it in one fused pass (bench/noise.py: the torch expression below
    costs several full-size int64 passes); native=False forces the torch expression, the reference.
    """
    R, B, H, T, L = shape
    if native is not False and choose("dt.gumbel", device) == "native":
        noise = _native.cpu_module().gumbel_hash(seed, R * B * H, T, L)
        return torch.from_numpy(noise).view(R, B, H, T, L).to(dtype)
    stream = torch.arange(R * B * H, device=device, dtype=torch.int64).view(R, B, H, 1, 1)
    key = fmix32((stream * GOLDEN + seed) & MASK32)
    counter = (torch.arange(T, device=device, dtype=torch.int64)[:, None] * L
               + torch.arange(L, device=device, dtype=torch.int64)[None, :])        # (T, L)
    return gumbel_from_bits(fmix32(key ^ counter)).to(dtype)


def gumbel_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """uint32 hash values (in int64) -> Gumbel samples, float32; finite for every input."""
    u = ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / 8388608.0)
    return -torch.log(-torch.log(u))
