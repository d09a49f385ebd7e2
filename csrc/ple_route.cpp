#include "ple_route.h"

#include <limits>
#include <vector>

namespace wtc {
namespace {

// Piecewise Linear Encoding (Gorishniy et al. 2022): bins b_0 < ... < b_n define n components;
// component t is (x - b_t) / (b_{t+1} - b_t) clipped to [0, 1], except that component 0 is not
// floored and component n-1 is not capped, so the encoding extrapolates linearly outside
// [b_0, b_n]. The torch twin, the reference the tests compare against, is wtc.dt.ple.ple.
inline float ple_component(float x, const float* bins, int t, int n) {
  float lo = bins[t], hi = bins[t + 1];
  float c = (x - lo) / (hi - lo);
  if (t > 0 && c < 0.f) c = 0.f;
  if (t < n - 1 && c > 1.f) c = 1.f;
  return c;
}

}  // namespace

void route_hard_cpu(const RouteShapes& s, const float* q, const float* k, const float* v,
                    const float* q_bins, const float* k_bins, const float* W, const float* u,
                    const float* rel, const float* abs_, int64_t* idx, float* value, float* margin) {
  const int64_t GN = s.G * s.N;
  const float inf = std::numeric_limits<float>::infinity();
#pragma omp parallel
  {
    // Per-thread scratch: key encodings (Lk, nk), one query's projection g = W^T PLE_q + u (nk).
    std::vector<float> kenc(s.Lk * s.nk), pq(s.nq), g(s.nk);
#pragma omp for schedule(static)
    for (int64_t gn = 0; gn < GN; ++gn) {
      const int64_t h = gn / s.N;
      const float* qb = q_bins + h * (s.nq + 1);
      const float* kb = k_bins + h * (s.nk + 1);
      const float* Wh = W + h * s.nq * s.nk;
      const float* uh = u + h * s.nk;
      const float* relh = rel + h * s.n_rel;
      const float* absh = abs_ + h * s.Lk;
      const float* krow = k + gn * s.Lk;
      const float* vrow = v + gn * s.Lk;
      for (int64_t j = 0; j < s.Lk; ++j)
        for (int t = 0; t < s.nk; ++t) kenc[j * s.nk + t] = ple_component(krow[j], kb, t, s.nk);
      for (int64_t i = 0; i < s.Lq; ++i) {
        const float qi = q[gn * s.Lq + i];
        for (int a = 0; a < s.nq; ++a) pq[a] = ple_component(qi, qb, a, s.nq);
        for (int c = 0; c < s.nk; ++c) g[c] = uh[c];
        for (int a = 0; a < s.nq; ++a) {
          const float pa = pq[a];
          if (pa == 0.f) continue;  // PLE codes are mostly exact zeros and ones
          const float* wr = Wh + a * s.nk;
          for (int c = 0; c < s.nk; ++c) g[c] += pa * wr[c];
        }
        const int64_t last = i + s.q_offset < s.Lk - 1 ? i + s.q_offset : s.Lk - 1;
        float best = -inf, second = -inf;
        int64_t arg = 0;
        for (int64_t j = 0; j <= last; ++j) {
          float sc = absh[j];
          const int64_t off = i + s.q_offset - j;
          if (off < s.n_rel) sc += relh[off];
          const float* kj = &kenc[j * s.nk];
          for (int c = 0; c < s.nk; ++c) sc += g[c] * kj[c];
          if (sc > best) {
            second = best;
            best = sc;
            arg = j;
          } else if (sc > second) {
            second = sc;
          }
        }
        const int64_t o = gn * s.Lq + i;
        idx[o] = arg;
        value[o] = vrow[arg];
        margin[o] = best - second;
      }
    }
  }
}

}  // namespace wtc
