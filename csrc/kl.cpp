#include "kl.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

// The same for z = base + d * dir computed on the fly (rank-1 ablation of the logits).
WTC_CLONES double kl_rank1_row(const double* p, double neg_entropy, double p_mass, const float* base, double d,
                               const float* dir, int64_t V) {
  double m = base[0] + d * dir[0];
  for (int64_t v = 1; v < V; ++v) {
    const double z = base[v] + d * dir[v];
    m = z > m ? z : m;
  }
  double sum = 0.0, pz = 0.0;
#pragma omp simd reduction(+ : sum, pz)
  for (int64_t v = 0; v < V; ++v) {
    const double z = base[v] + d * dir[v];
    sum += std::exp(z - m);
    pz += p[v] * z;
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

namespace {

// Shared driver of the two row-wise KLs: one clean row n serves all A ablations, so p = exp(logp),
// sum p log p and sum p are computed once per row; row_kl(p, neg_entropy, p_mass, a, n) does the rest.
template <class RowKL>
void kl_per_clean_row(const double* logp, int64_t A, int64_t N, int64_t V, double* out, RowKL row_kl) {
#pragma omp parallel
  {
    std::vector<double> p(V);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const double* lp = logp + n * V;
      double neg_entropy = 0.0, p_mass = 0.0;
#pragma omp simd reduction(+ : neg_entropy, p_mass)
      for (int64_t v = 0; v < V; ++v) {
        p[v] = std::exp(lp[v]);
        neg_entropy += p[v] * lp[v];
        p_mass += p[v];
      }
      for (int64_t a = 0; a < A; ++a) out[a * N + n] = row_kl(p.data(), neg_entropy, p_mass, a, n);
    }
  }
}

}  // namespace

void kl_rows_cpu(const double* logp, const float* logits, int64_t A, int64_t N, int64_t V, double* out) {
  kl_per_clean_row(logp, A, N, V, out, [=](const double* p, double ne, double pm, int64_t a, int64_t n) {
    return kl_one_row(p, ne, pm, logits + (a * N + n) * V, V);
  });
}

void kl_rank1_cpu(const double* logp, const float* logits, const float* delta, const float* direction,
                  int64_t A, int64_t N, int64_t V, double* out) {
  kl_per_clean_row(logp, A, N, V, out, [=](const double* p, double ne, double pm, int64_t a, int64_t n) {
    return kl_rank1_row(p, ne, pm, logits + n * V, delta[a * N + n], direction + a * V, V);
  });
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
  // Order: larger KL first, ties to the lower position (a strict total order, so the set is
  // unique). Non-negative floats order like their bit patterns, so one pass builds a histogram
  // of mass over the top bits; walking it from the top finds the bucket where the mass is
  // reached, and only that bucket is sorted. Two passes over N instead of a selection with a
  // comparator: 175 -> 50 us per weight at N = 8192, 2 threads (4096 rows of random KL).
  constexpr int kShift = 20;                                   // 12 top bits: 4096 buckets
  constexpr int kBuckets = 1 << (32 - kShift);
  std::vector<std::vector<int32_t>> chosen(M);
#pragma omp parallel
  {
    std::vector<uint32_t> key(N);
    std::vector<double> bucket_mass(kBuckets);
    std::vector<int32_t> members;
#pragma omp for schedule(dynamic, 16)
    for (int64_t m = 0; m < M; ++m) {
      const float* row = kl + m * N;
      std::fill(bucket_mass.begin(), bucket_mass.end(), 0.0);
      double total = 0.0;
      for (int64_t n = 0; n < N; ++n) {
        const float v = row[n] > 0.0f ? row[n] : 0.0f;
        uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        key[n] = bits;
        bucket_mass[bits >> kShift] += v;
        total += v;
      }
      if (total <= 0.0) continue;
      double need = mass * total * (1.0 - 1e-12), above = 0.0;
      int threshold = 0;
      for (int b = kBuckets - 1; b >= 0; --b) {
        if (above + bucket_mass[b] >= need) { threshold = b; break; }
        above += bucket_mass[b];
      }
      members.clear();
      for (int64_t n = 0; n < N; ++n)
        if (static_cast<int>(key[n] >> kShift) == threshold) members.push_back(static_cast<int32_t>(n));
      std::sort(members.begin(), members.end(),
                [&key](int32_t a, int32_t b) { return key[a] > key[b] || (key[a] == key[b] && a < b); });
      need -= above;
      size_t take = 0;
      double acc = 0.0;
      while (take < members.size() && acc < need) {
        float v;
        std::memcpy(&v, &key[members[take]], sizeof v);
        acc += v;
        ++take;
      }
      members.resize(take);
      std::sort(members.begin(), members.end());
      std::vector<int32_t>& out = chosen[m];
      size_t next = 0;
      for (int64_t n = 0; n < N; ++n) {                        // merge, in position order
        const bool in_bucket = next < members.size() && members[next] == n;
        if (in_bucket) ++next;
        if (static_cast<int>(key[n] >> kShift) > threshold || in_bucket) out.push_back(static_cast<int32_t>(n));
      }
    }
  }
  offsets.assign(M + 1, 0);
  for (int64_t m = 0; m < M; ++m) offsets[m + 1] = offsets[m] + static_cast<int64_t>(chosen[m].size());
  positions.resize(offsets[M]);
  for (int64_t m = 0; m < M; ++m) std::copy(chosen[m].begin(), chosen[m].end(), positions.begin() + offsets[m]);
}

}  // namespace wtc
