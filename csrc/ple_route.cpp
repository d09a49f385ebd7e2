#include "ple_route.h"

#include <limits>
#include <vector>

#include "ple.h"

namespace wtc {

void ple_encode_cpu(const float* x, int64_t n, const float* bins, int n_bins, float* out) {
#pragma omp parallel for schedule(static) if (n > 4096)
  for (int64_t i = 0; i < n; ++i)
    for (int t = 0; t < n_bins; ++t) out[i * n_bins + t] = ple_component(x[i], bins, t, n_bins);
}

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
