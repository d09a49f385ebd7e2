// Counter-based Gumbel noise for the DT's attention: one value per (seed, stream, query, key),
// the same bits as wtc/dt/noise.py (torch) and the Triton routing kernel regenerate. Compiled
// with -ffast-math so the two logs vectorise (glibc libmvec); the hash itself is exact.
#pragma once
#include <cstdint>

namespace wtc {

// out (streams, T, L): g = -log(-log(u)), u = ((fmix32(key ^ (i * L + j)) >> 9) + 0.5) / 2^23,
// key = fmix32(stream * 0x9E3779B9 + seed) (uint32 arithmetic).
void gumbel_hash_cpu(uint32_t seed, int64_t streams, int64_t T, int64_t L, float* out);

// One stream's values c = 0 .. count-1 (c = i * L + j), the same as gumbel_hash_cpu's row `stream`.
void gumbel_stream_cpu(uint32_t seed, int64_t stream, int64_t count, float* row);

}  // namespace wtc
