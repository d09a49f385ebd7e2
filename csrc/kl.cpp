#include "kl.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace wtc {

// Hot loops are cloned for AVX2 / AVX-512 and picked at load time, so one portable build uses the
// vector units of the machine it runs on.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WTC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define WTC_CLONES
#endif

namespace {

// KL of one ablated row against clean row (p, sum p log p, sum p): two passes over a row that
// sits in L1 (max, then exp-sum and the p.z dot product) so both loops vectorise.
WTC_CLONES double kl_one_row(const double* p, double neg_entropy, double p_mass, const float* z, int64_t V) {
  float zmax = z[0];
  for (int64_t v = 1; v < V; ++v) zmax = z[v] > zmax ? z[v] : zmax;
  const double m = zmax;
  double sum = 0.0, pz = 0.0;
#pragma omp simd reduction(+ : sum, pz)
  for (int64_t v = 0; v < V; ++v) {
    const double zv = z[v];
    sum += std::exp(zv - m);
    pz += p[v] * zv;
  }
  return neg_entropy - pz + p_mass * (m + std::log(sum));
}

// p d + log1p(p expm1(-d)) without the cancellation of its two terms at small d: it equals
// p (d + expm1(-d)) + [log1p(x) - x] with x = p expm1(-d), each part by its series when small.
WTC_CLONES void unembed_row(const double* p, const double* h, double w, int64_t N, float* out, double* total) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t n = 0; n < N; ++n) {
    const double d = w * h[n];
    const double em1 = std::expm1(-d);
    const double d2 = d * d;
    const double d_plus_em1 = std::fabs(d) < 1e-3 ? d2 * (0.5 - d / 6.0 + d2 / 24.0 - d2 * d / 120.0) : d + em1;
    const double x = p[n] * em1;
    const double x2 = x * x;
    const double log1p_minus_x = std::fabs(x) < 1e-4 ? x2 * (-0.5 + x / 3.0 - x2 / 4.0 + x2 * x / 5.0)
                                                     : std::log1p(x) - x;
    const double kl = p[n] * d_plus_em1 + log1p_minus_x;
    acc += kl;
    if (out) out[n] = static_cast<float>(kl);
  }
  *total = acc;
}

}  // namespace

void kl_rows_cpu(const float* logp, const float* logits, int64_t A, int64_t N, int64_t V, double* out) {
  // One clean row n serves all A ablations: p = exp(logp) once per row, then A ablated rows.
#pragma omp parallel
  {
    std::vector<double> p(V);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* lp = logp + n * V;
      double neg_entropy = 0.0, p_mass = 0.0;
      for (int64_t v = 0; v < V; ++v) {
        p[v] = std::exp(static_cast<double>(lp[v]));
        neg_entropy += p[v] * lp[v];
        p_mass += p[v];
      }
      for (int64_t a = 0; a < A; ++a)
        out[a * N + n] = kl_one_row(p.data(), neg_entropy, p_mass, logits + (a * N + n) * V, V);
    }
  }
}

void kl_unembed_cpu(const float* logp, const float* h, const float* W, int64_t N, int64_t V, int64_t D,
                    const int64_t* v, const int64_t* j, int64_t M, float* per_position, double* total) {
  // Transposed, float64 copies of the columns the pairs use: p[v] = (N,) and h[j] = (N,), so the
  // loop over positions runs over contiguous memory.
  std::vector<int64_t> v_slot(V, -1), j_slot(D, -1);
  std::vector<int64_t> vs, js;
  for (int64_t m = 0; m < M; ++m) {
    if (v_slot[v[m]] < 0) { v_slot[v[m]] = static_cast<int64_t>(vs.size()); vs.push_back(v[m]); }
    if (j_slot[j[m]] < 0) { j_slot[j[m]] = static_cast<int64_t>(js.size()); js.push_back(j[m]); }
  }
  std::vector<double> pT(vs.size() * N), hT(js.size() * N);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (size_t a = 0; a < vs.size(); ++a) pT[a * N + n] = std::exp(static_cast<double>(logp[n * V + vs[a]]));
    for (size_t b = 0; b < js.size(); ++b) hT[b * N + n] = h[n * D + js[b]];
  }
#pragma omp parallel for schedule(dynamic, 8)
  for (int64_t m = 0; m < M; ++m) {
    const double w = W[v[m] * D + j[m]];
    float* out = per_position ? per_position + m * N : nullptr;
    if (w == 0.0) {
      total[m] = 0.0;
      if (out) std::fill(out, out + N, 0.0f);
      continue;
    }
    unembed_row(pT.data() + v_slot[v[m]] * N, hT.data() + j_slot[j[m]] * N, w, N, out, total + m);
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
