// One thread per (head, sequence, query): recompute key encodings on the fly (nk is small, ~16),
// so nothing of size (Lk, nk) is stored.
#include <cuda_runtime.h>

#include <cfloat>

#include "cuda/route_hard.h"
#include "ple.h"

namespace wtc {
namespace {

constexpr int kMaxBins = 64;

__global__ void route_hard_kernel(RouteShapes s, const float* __restrict__ q,
                                  const float* __restrict__ k, const float* __restrict__ v,
                                  const float* __restrict__ q_bins,
                                  const float* __restrict__ k_bins, const float* __restrict__ W,
                                  const float* __restrict__ u, const float* __restrict__ rel,
                                  const float* __restrict__ abs_, int64_t* idx, float* value,
                                  float* margin) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= s.G * s.N * s.Lq) return;
  const int64_t i = t % s.Lq, gn = t / s.Lq, h = gn / s.N;
  const float* qb = q_bins + h * (s.nq + 1);
  const float* kb = k_bins + h * (s.nk + 1);
  const float* Wh = W + h * s.nq * s.nk;
  float g[kMaxBins];
  for (int c = 0; c < s.nk; ++c) g[c] = u[h * s.nk + c];
  const float qi = q[gn * s.Lq + i];
  for (int a = 0; a < s.nq; ++a) {
    const float pa = ple_component(qi, qb, a, s.nq);
    if (pa == 0.f) continue;
    for (int c = 0; c < s.nk; ++c) g[c] += pa * Wh[a * s.nk + c];
  }
  const int64_t last = min(i + s.q_offset, s.Lk - 1);
  float best = -INFINITY, second = -INFINITY;
  int64_t arg = 0;
  for (int64_t j = 0; j <= last; ++j) {
    const float kj = k[gn * s.Lk + j];
    float sc = abs_[h * s.Lk + j];
    const int64_t off = i + s.q_offset - j;
    if (off < s.n_rel) sc += rel[h * s.n_rel + off];
    for (int c = 0; c < s.nk; ++c) sc += g[c] * ple_component(kj, kb, c, s.nk);
    if (sc > best) {
      second = best;
      best = sc;
      arg = j;
    } else if (sc > second) {
      second = sc;
    }
  }
  idx[t] = arg;
  value[t] = v[gn * s.Lk + arg];
  margin[t] = best - second;
}

}  // namespace

int route_hard_cuda(const RouteShapes& s, const float* q, const float* k, const float* v,
                    const float* q_bins, const float* k_bins, const float* W, const float* u,
                    const float* rel, const float* abs_, int64_t* idx, float* value,
                    float* margin, uintptr_t stream) {
  if (s.nk > kMaxBins) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t n = s.G * s.N * s.Lq;
  if (n == 0) return 0;
  const int threads = 128;
  const int64_t blocks = (n + threads - 1) / threads;
  route_hard_kernel<<<static_cast<unsigned>(blocks), threads, 0,
                      reinterpret_cast<cudaStream_t>(stream)>>>(s, q, k, v, q_bins, k_bins, W, u,
                                                                rel, abs_, idx, value, margin);
  return static_cast<int>(cudaGetLastError());
}

const char* cuda_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace wtc
