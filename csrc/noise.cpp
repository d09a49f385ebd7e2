#include "noise.h"

#include <omp.h>

#include <cmath>

namespace wtc {
namespace {

inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

}  // namespace

#define WTC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

WTC_CLONES void gumbel_stream_cpu(uint32_t seed, int64_t stream, int64_t count, float* row) {
  const uint32_t key = fmix32(static_cast<uint32_t>(stream) * 0x9E3779B9u + seed);
#pragma omp simd
  for (int64_t c = 0; c < count; ++c) {   // c = i * L + j
    const uint32_t bits = fmix32(key ^ static_cast<uint32_t>(c));
    const float u = (static_cast<float>(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
    row[c] = -logf(-logf(u));
  }
}

void gumbel_hash_cpu(uint32_t seed, int64_t streams, int64_t T, int64_t L, float* out) {
  const int64_t per_stream = T * L;
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < streams; ++s) gumbel_stream_cpu(seed, s, per_stream, out + s * per_stream);
}

}  // namespace wtc
