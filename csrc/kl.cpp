#include "kl.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace wtc {

void kl_rows_cpu(const float* logp, const float* logits, int64_t A, int64_t N, int64_t V, double* out) {
  // sum_v p_v log p_v per clean row, shared by all A ablations.
  std::vector<double> neg_entropy(N);
  std::vector<double> p_mass(N);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* lp = logp + n * V;
    double s = 0.0, m = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(static_cast<double>(lp[v]));
      s += p * lp[v];
      m += p;
    }
    neg_entropy[n] = s;
    p_mass[n] = m;
  }
  // KL = sum p log p - sum p z + (sum p) logsumexp(z): one pass over z with an online max.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < A * N; ++r) {
    const int64_t n = r % N;
    const float* z = logits + r * V;
    const float* lp = logp + n * V;
    double zmax = -INFINITY, sum = 0.0, pz = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      const double zv = z[v];
      if (zv > zmax) {
        sum = sum * std::exp(zmax - zv) + 1.0;
        zmax = zv;
      } else {
        sum += std::exp(zv - zmax);
      }
      pz += std::exp(static_cast<double>(lp[v])) * zv;
    }
    out[r] = neg_entropy[n] - pz + p_mass[n] * (zmax + std::log(sum));
  }
}

namespace {

// p d + log1p(p expm1(-d)) without the cancellation of its two terms at small d: the first is
// p (d + expm1(-d)) + [log1p(x) - x] with x = p expm1(-d), each part by its series when small.
inline double unembed_kl(double p, double d) {
  double d_plus_em1;
  if (std::fabs(d) < 1e-3) {
    const double d2 = d * d;
    d_plus_em1 = d2 * (0.5 - d / 6.0 + d2 / 24.0 - d2 * d / 120.0);
  } else {
    d_plus_em1 = d + std::expm1(-d);
  }
  const double x = p * std::expm1(-d);
  double log1p_minus_x;
  if (std::fabs(x) < 1e-4) {
    const double x2 = x * x;
    log1p_minus_x = x2 * (-0.5 + x / 3.0 - x2 / 4.0 + x2 * x / 5.0);
  } else {
    log1p_minus_x = std::log1p(x) - x;
  }
  return p * d_plus_em1 + log1p_minus_x;
}

}  // namespace

void kl_unembed_cpu(const float* logp, const float* h, const float* W, int64_t N, int64_t V, int64_t D,
                    int64_t v0, int64_t v1, float* per_position, double* total) {
  const int64_t rows = v1 - v0;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < D; ++j) {
      const int64_t v = v0 + r;
      const double w = W[v * D + j];
      double acc = 0.0;
      float* pp = per_position ? per_position + (r * D + j) * N : nullptr;
      for (int64_t n = 0; n < N; ++n) {
        const double p = std::exp(static_cast<double>(logp[n * V + v]));
        const double kl = w == 0.0 ? 0.0 : unembed_kl(p, w * h[n * D + j]);
        acc += kl;
        if (pp) pp[n] = static_cast<float>(kl);
      }
      total[r * D + j] = acc;
    }
  }
}

void importance_positions_cpu(const float* kl, int64_t M, int64_t N, double mass,
                              std::vector<int64_t>& offsets, std::vector<int32_t>& positions) {
  std::vector<std::vector<int32_t>> chosen(M);
#pragma omp parallel
  {
    std::vector<int32_t> idx(N);
#pragma omp for schedule(dynamic, 16)
    for (int64_t m = 0; m < M; ++m) {
      const float* row = kl + m * N;
      double total = 0.0;
      for (int64_t n = 0; n < N; ++n) total += std::max(0.0f, row[n]);
      if (total <= 0.0) continue;
      const double target = mass * total;
      auto before = [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); };
      std::iota(idx.begin(), idx.end(), 0);
      // Grow k geometrically with nth_element (O(N) each) until the top k hold the target,
      // then sort only those k: selection, not a full sort.
      int64_t k = std::min<int64_t>(N, 8);
      while (true) {
        std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), before);
        double top = 0.0;
        for (int64_t i = 0; i < k; ++i) top += std::max(0.0f, row[idx[i]]);
        if (top >= target * (1.0 - 1e-12) || k == N) break;
        k = std::min<int64_t>(N, 2 * k);
      }
      std::sort(idx.begin(), idx.begin() + k, before);
      double acc = 0.0;
      int64_t count = 0;
      while (count < k) {
        acc += std::max(0.0f, row[idx[count]]);
        ++count;
        if (acc >= target * (1.0 - 1e-12)) break;
      }
      chosen[m].assign(idx.begin(), idx.begin() + count);
    }
  }
  offsets.assign(M + 1, 0);
  for (int64_t m = 0; m < M; ++m) offsets[m + 1] = offsets[m] + static_cast<int64_t>(chosen[m].size());
  positions.resize(offsets[M]);
  for (int64_t m = 0; m < M; ++m) std::copy(chosen[m].begin(), chosen[m].end(), positions.begin() + offsets[m]);
}

}  // namespace wtc
