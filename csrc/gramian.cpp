#include "gramian.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <vector>

namespace wtc {
namespace {

// Packed layout: the rows of a block are widened to float64 (centred on the fly) into panels of
// W = 8 columns; panel p holds rows 0..kc-1 of columns 8p..8p+7 contiguously (row stride W, panel
// stride ldp * W), so a micro tile reads its operands as unit-stride streams and every panel row
// is one 64-byte line. Columns past D are zero. The panel count is padded to a multiple of 3 (the
// widest micro tile spans 3 panels) with panels that stay zero.
constexpr int W = 8;
constexpr int kPanelRound = 3;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WTC_GRAMIAN_DISPATCH 1
#define WTC_TARGET(arch) __attribute__((target(arch)))
#else
#define WTC_TARGET(arch)
#endif
#define WTC_INLINE inline __attribute__((always_inline))

// One MR x NR tile of C (NR = NB * W): acc[i][j] = sum_k a[k][i] b[k][j] in registers (MR * NR / VW
// vector accumulators), then added to C with bounds at the matrix edge. a: MR consecutive columns
// within one panel (row stride W); b: NB consecutive panels.
template <int MR, int NB, int VW>
WTC_INLINE void micro_tile(const double* a, const double* b, int64_t kc, int64_t ldp, double* C, int64_t ldc,
                           int64_t D, int64_t i0, int64_t j0) {
  typedef double vec __attribute__((vector_size(VW * sizeof(double)), may_alias));
  constexpr int PV = W / VW;          // vectors per panel row
  constexpr int NV = NB * PV;         // vectors across the tile
  constexpr int NR = NB * W;
  vec acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = vec{};
  for (int64_t k = 0; k < kc; ++k) {
    vec bv[NV];
    for (int q = 0; q < NB; ++q)
      for (int p = 0; p < PV; ++p) bv[q * PV + p] = *reinterpret_cast<const vec*>(b + q * ldp * W + k * W + p * VW);
    for (int i = 0; i < MR; ++i) {
      const double ai = a[k * W + i];
      for (int v = 0; v < NV; ++v) acc[i][v] += ai * bv[v];
    }
  }
  if (i0 + MR <= D && j0 + NR <= D) {
    for (int i = 0; i < MR; ++i) {
      double* c = C + i * ldc;
      for (int v = 0; v < NV; ++v)
        for (int t = 0; t < VW; ++t) c[v * VW + t] += acc[i][v][t];
    }
  } else {
    for (int i = 0; i < MR && i0 + i < D; ++i) {
      double* c = C + i * ldc;
      for (int v = 0; v < NV; ++v)
        for (int t = 0; t < VW; ++t)
          if (j0 + v * VW + t < D) c[v * VW + t] += acc[i][v][t];
    }
  }
}

// The micro tiles of C[i0:i1, j0:j1] that touch the upper triangle (i0, j0 aligned to the tile
// sizes); element (i, j) of C lives at C[(i - ci) * ldc + (j - cj)], and only i, j < D are written.
// Operands: pa holds the panels of columns ca.., pb those of columns cb.. (the same buffer when both
// come from one packing). The b panels of a tile column stay in L1 while a panels stream.
template <int MR, int NB, int VW>
WTC_INLINE void unit_impl(const double* pa, int64_t ca, const double* pb, int64_t cb, int64_t kc, int64_t ldp,
                          double* C, int64_t ldc, int64_t ci, int64_t cj, int64_t D, int64_t i0, int64_t i1,
                          int64_t j0, int64_t j1) {
  constexpr int NR = NB * W;
  for (int64_t j = j0; j < j1; j += NR) {
    const double* b = pb + ((j - cb) / W) * ldp * W;
    for (int64_t i = i0; i < i1 && i < j + NR; i += MR)
      micro_tile<MR, NB, VW>(pa + ((i - ca) / W) * ldp * W + (i - ca) % W, b, kc, ldp,
                             C + (i - ci) * ldc + (j - cj), ldc, D, i, j);
  }
}

using UnitFn = void (*)(const double*, int64_t, const double*, int64_t, int64_t, int64_t, double*, int64_t, int64_t,
                        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
#define WTC_UNIT_ARGS                                                                                         \
  const double *pa, int64_t ca, const double *pb, int64_t cb, int64_t kc, int64_t ldp, double *C, int64_t ldc, \
      int64_t ci, int64_t cj, int64_t D, int64_t i0, int64_t i1, int64_t j0, int64_t j1

// AVX-512: 8 x 24 tile, 24 zmm accumulators. AVX2: 4 x 8, 8 ymm. Portable: the same shape in
// 2-wide vectors (SSE2, or whatever the compiler makes of them elsewhere).
#ifdef WTC_GRAMIAN_DISPATCH
WTC_TARGET("arch=x86-64-v4")
void unit_avx512(WTC_UNIT_ARGS) {
  unit_impl<8, 3, 8>(pa, ca, pb, cb, kc, ldp, C, ldc, ci, cj, D, i0, i1, j0, j1);
}
WTC_TARGET("arch=x86-64-v3")
void unit_avx2(WTC_UNIT_ARGS) {
  unit_impl<4, 1, 4>(pa, ca, pb, cb, kc, ldp, C, ldc, ci, cj, D, i0, i1, j0, j1);
}
#endif
void unit_portable(WTC_UNIT_ARGS) {
  unit_impl<4, 1, 2>(pa, ca, pb, cb, kc, ldp, C, ldc, ci, cj, D, i0, i1, j0, j1);
}

bool cpu_has(int kernel) {
  if (kernel == kGramianPortable) return true;
#ifdef WTC_GRAMIAN_DISPATCH
  __builtin_cpu_init();
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
                  __builtin_cpu_supports("bmi2");
  if (kernel == kGramianAvx2) return v3;
  if (kernel == kGramianAvx512)
    return v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512cd");
#endif
  return false;
}

UnitFn unit_fn(int resolved) {
#ifdef WTC_GRAMIAN_DISPATCH
  if (resolved == kGramianAvx512) return unit_avx512;
  if (resolved == kGramianAvx2) return unit_avx2;
#endif
  return unit_portable;
}

// 64-byte aligned doubles, uninitialised. The work buffers of a parallel region are one such block
// allocated by the calling thread and split per thread (each zeroes its own part): allocating them
// inside the region would put them in per-thread malloc arenas, which keep freed blocks and grew
// the process by ~200 MB over a stream of D = 1024 chunks.
struct AlignedBuffer {
  double* p = nullptr;
  explicit AlignedBuffer(size_t n) {
    const size_t bytes = ((n * sizeof(double) + 63) / 64) * 64;
    p = static_cast<double*>(std::aligned_alloc(64, bytes ? bytes : 64));
    if (!p) throw std::bad_alloc();
  }
  ~AlignedBuffer() { std::free(p); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
};

template <class T>
WTC_INLINE const T* row_ptr(const RowView<T>& X, int64_t r) {
  return X.base + (r / X.K) * X.s0 + (r % X.K) * X.s1;
}

// Rows r0..r0+kc-1 of X, columns c0..c0+npan*W-1, into npan panels at P (panel stride ldp * W):
// widened to float64, minus center when given; columns at or past D are zero.
template <class T>
void pack_block(const RowView<T>& X, const double* center, int64_t r0, int64_t kc, int64_t c0, int64_t npan,
                int64_t ldp, double* P) {
  const int64_t D = X.D, cs = X.cs;
  for (int64_t r = 0; r < kc; ++r) {
    const T* row = row_ptr(X, r0 + r);
    double* dst = P + r * W;
    for (int64_t p = 0; p < npan; ++p) {
      double* o = dst + p * ldp * W;
      const int64_t d0 = c0 + p * W;
      if (d0 + W <= D && cs == 1) {
        const T* src = row + d0;
        if (center) {
          const double* m = center + d0;
          for (int j = 0; j < W; ++j) o[j] = static_cast<double>(src[j]) - m[j];
        } else {
          for (int j = 0; j < W; ++j) o[j] = static_cast<double>(src[j]);
        }
      } else {
        for (int j = 0; j < W; ++j) {
          const int64_t d = d0 + j;
          o[j] = d < D ? static_cast<double>(row[d * cs]) - (center ? center[d] : 0.0) : 0.0;
        }
      }
    }
  }
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Work units: B x B blocks of C on or above the diagonal, as (i0, i1, j0, j1); B a multiple of every
// tile size (MR and NR of each kernel).
std::vector<int64_t> upper_units(int64_t D, int64_t B) {
  std::vector<int64_t> units;
  const int64_t nb = (D + B - 1) / B;
  for (int64_t ib = 0; ib < nb; ++ib)
    for (int64_t jb = ib; jb < nb; ++jb)
      units.insert(units.end(), {ib * B, std::min(D, (ib + 1) * B), jb * B, std::min(D, (jb + 1) * B)});
  return units;
}

// One rank-k update to do: rows of X (centred on center, or not) into C.
template <class T>
struct Job {
  RowView<T> X;
  const double* center;
  double* C;
};

// Small D: OpenMP over blocks of rows of both jobs (one dynamic loop); each thread packs its block
// once (all columns) and updates a private copy of its job's C (row stride padded off a power of
// two, so a tile's rows do not share cache sets), added into C at the end. No barrier per block,
// so a thread slowed down by another process on its core does not hold the others up.
template <class T1, class T2>
void syrk_rows_parallel(const Job<T1>& a, const Job<T2>& b, UnitFn fn) {
  const int64_t D = a.X.D;
  const int64_t ldp = D <= 256 ? 256 : 128, ldc = round_up(D, W) + W;
  const int64_t npan = round_up((D + W - 1) / W, kPanelRound);
  const std::vector<int64_t> units = upper_units(D, 48);
  const int64_t n_units = static_cast<int64_t>(units.size() / 4);
  const int64_t na = (a.X.rows + ldp - 1) / ldp, nb = (b.X.rows + ldp - 1) / ldp;
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), na + nb)));
  const int64_t p_size = round_up(npan * ldp * W, W), c_size = round_up(D * ldc, W);
  AlignedBuffer work(static_cast<size_t>(threads * (p_size + 2 * c_size)));
#pragma omp parallel num_threads(threads)
  {
    double* P = work.p + omp_get_thread_num() * (p_size + 2 * c_size);
    double* Cs[2] = {nullptr, nullptr};
    std::memset(P, 0, sizeof(double) * p_size);           // padding panels stay zero
    auto block = [&](const auto& job, int64_t blk, int which) {
      if (!Cs[which]) {
        Cs[which] = P + p_size + which * c_size;
        std::memset(Cs[which], 0, sizeof(double) * c_size);
      }
      const int64_t r0 = blk * ldp, kc = std::min(ldp, job.X.rows - r0);
      pack_block(job.X, job.center, r0, kc, 0, npan, ldp, P);
      for (int64_t u = 0; u < n_units; ++u) {
        const int64_t* q = units.data() + 4 * u;
        fn(P, 0, P, 0, kc, ldp, Cs[which], ldc, 0, 0, D, q[0], q[1], q[2], q[3]);
      }
    };
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t t = 0; t < na + nb; ++t) {
      if (t < na) block(a, t, 0);
      else block(b, t - na, 1);
    }
#pragma omp critical
    {
      for (auto [Cp, C] : {std::make_pair(Cs[0], a.C), std::make_pair(Cs[1], b.C)})
        if (Cp)
          for (int64_t i = 0; i < D; ++i)
            for (int64_t j = i; j < D; ++j) C[i * D + j] += Cp[i * ldc + j];
    }
  }
}

// Large D: OpenMP over B x B blocks of C of both jobs; each unit streams all rows, packing just its
// two column ranges, into a private B x B block (in L2 for the whole chunk), added into C at the
// unit's end. No barrier but the last one.
template <class T1, class T2>
void syrk_tiles_parallel(const Job<T1>& a, const Job<T2>& b, UnitFn fn) {
  const int64_t D = a.X.D;
  const int64_t ldp = 128, B = 192, ldc = B + W;
  const int64_t npan = round_up(B / W, kPanelRound);
  const std::vector<int64_t> units = upper_units(D, B);
  const int64_t n_units = static_cast<int64_t>(units.size() / 4);
  const int64_t na = a.X.rows > 0 ? n_units : 0, nb = b.X.rows > 0 ? n_units : 0;
  const int threads = omp_get_max_threads();
  const int64_t p_size = npan * ldp * W, c_size = B * ldc;
  AlignedBuffer work(static_cast<size_t>(threads * (2 * p_size + c_size)));
#pragma omp parallel num_threads(threads)
  {
    double* pa = work.p + omp_get_thread_num() * (2 * p_size + c_size);
    double* pb = pa + p_size;
    double* Cb = pb + p_size;
    std::memset(pa, 0, sizeof(double) * 2 * p_size);      // padding panels stay zero
    auto unit = [&](const auto& job, const int64_t* q) {
      const bool diagonal = q[0] == q[2];
      const int64_t pa_n = (round_up(q[1] - q[0], 24) + W - 1) / W, pb_n = (round_up(q[3] - q[2], 24) + W - 1) / W;
      std::memset(Cb, 0, sizeof(double) * c_size);
      for (int64_t r0 = 0; r0 < job.X.rows; r0 += ldp) {
        const int64_t kc = std::min(ldp, job.X.rows - r0);
        pack_block(job.X, job.center, r0, kc, q[0], pa_n, ldp, pa);
        if (!diagonal) pack_block(job.X, job.center, r0, kc, q[2], pb_n, ldp, pb);
        fn(pa, q[0], diagonal ? pa : pb, q[2], kc, ldp, Cb, ldc, q[0], q[2], D, q[0], q[1], q[2], q[3]);
      }
      for (int64_t i = q[0]; i < q[1]; ++i)
        for (int64_t j = std::max(i, q[2]); j < q[3]; ++j) job.C[i * D + j] += Cb[(i - q[0]) * ldc + (j - q[2])];
    };
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < na + nb; ++t) {
      if (t < na) unit(a, units.data() + 4 * t);
      else unit(b, units.data() + 4 * (t - na));
    }
  }
}

template <class T1, class T2>
void syrk_pair(const Job<T1>& a, const Job<T2>& b, int kernel) {
  if (a.X.D == 0 || a.X.rows + b.X.rows == 0) return;
  const int resolved = gramian_kernel_resolve(kernel);
  if (resolved < 0) throw std::invalid_argument("this CPU cannot run the requested Gramian kernel");
  // private D x D copies per thread up to D = 1024 (8 MB each); blocks of C above that
  if (a.X.D <= 1024)
    syrk_rows_parallel(a, b, unit_fn(resolved));
  else
    syrk_tiles_parallel(a, b, unit_fn(resolved));
}

}  // namespace

int gramian_kernel_resolve(int kernel) {
  if (kernel == kGramianAuto) {
    for (int k : {kGramianAvx512, kGramianAvx2, kGramianPortable})
      if (cpu_has(k)) return k;
  }
  if (kernel < kGramianPortable || kernel > kGramianAvx512) return -1;
  return cpu_has(kernel) ? kernel : -1;
}

const char* gramian_kernel_name(int resolved) {
  switch (resolved) {
    case kGramianPortable: return "portable";
    case kGramianAvx2: return "avx2";
    case kGramianAvx512: return "avx512";
    default: return "unavailable";
  }
}

template <class T>
int64_t first_nonfinite(const RowView<T>& v) {
  const int64_t N = v.rows, D = v.D;
  const T big = std::numeric_limits<T>::max();
  int64_t first = -1;
#pragma omp parallel
  {
    int64_t mine = -1;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      if (mine >= 0) continue;                 // this thread's rows come in order: keep its first
      const T* row = row_ptr(v, r);
      bool bad = false;
      if (v.cs == 1) {
        for (int64_t d = 0; d < D; ++d) bad |= !(std::fabs(row[d]) <= big);      // NaN fails too
      } else {
        for (int64_t d = 0; d < D; ++d) bad |= !(std::fabs(row[d * v.cs]) <= big);
      }
      if (bad)
        for (int64_t d = 0; d < D; ++d)
          if (!std::isfinite(row[d * v.cs])) { mine = r * D + d; break; }
    }
#pragma omp critical
    if (mine >= 0 && (first < 0 || mine < first)) first = mine;
  }
  return first;
}

template <class T>
void syrk_upper_cpu(const RowView<T>& X, const double* center, double* C, int kernel) {
  const RowView<T> none{X.base, 0, X.D, 1, 0, 0, 1};
  syrk_pair(Job<T>{X, center, C}, Job<T>{none, nullptr, C}, kernel);
}

template <class TH, class TJ>
GramianStatus gramian_update_cpu(const RowView<TH>& h, const RowView<TJ>& J, int64_t n_prev, double* mean,
                                 double* m2, double* jj, int kernel) {
  const int64_t n = h.rows, D = h.D;
  GramianStatus status;
  if (n == 0) return status;
  // Chunk mean of h (float64, per-thread partial sums; a non-finite h shows up in them) and the
  // finiteness of J, both settled before anything is written.
  std::vector<double> mu(D, 0.0);
#pragma omp parallel
  {
    std::vector<double> part(D, 0.0);
#pragma omp for schedule(static) nowait
    for (int64_t r = 0; r < n; ++r) {
      const TH* row = row_ptr(h, r);
      if (h.cs == 1) {
        for (int64_t d = 0; d < D; ++d) part[d] += static_cast<double>(row[d]);
      } else {
        for (int64_t d = 0; d < D; ++d) part[d] += static_cast<double>(row[d * h.cs]);
      }
    }
#pragma omp critical
    for (int64_t d = 0; d < D; ++d) mu[d] += part[d];
  }
  status.bad_j = first_nonfinite(J);
  bool finite = true;
  for (int64_t d = 0; d < D; ++d) {
    mu[d] /= static_cast<double>(n);
    finite &= std::isfinite(mu[d]);
  }
  if (!finite) {
    status.bad_h = first_nonfinite(h);
    status.overflow = status.bad_h < 0;
  }
  if (!status.ok()) return status;

  // scatter of the chunk about its own mean, and J^T J, in one parallel region
  syrk_pair(Job<TH>{h, mu.data(), m2}, Job<TJ>{J, nullptr, jj}, kernel);

  // Chan: M2 += (n_a n_b / n) d d^T, mean += d n_b / n, d = mean_b - mean_a (upper triangle)
  if (n_prev > 0) {
    const double na = static_cast<double>(n_prev), nb = static_cast<double>(n), nt = na + nb, c = na * nb / nt;
    std::vector<double> delta(D);
    for (int64_t d = 0; d < D; ++d) delta[d] = mu[d] - mean[d];
#pragma omp parallel for schedule(dynamic, 16) if (D > 1024)
    for (int64_t i = 0; i < D; ++i) {
      const double ci = c * delta[i];
      double* row = m2 + i * D;
      for (int64_t j = i; j < D; ++j) row[j] += ci * delta[j];
    }
    for (int64_t d = 0; d < D; ++d) mean[d] += delta[d] * (nb / nt);
  } else {
    std::copy(mu.begin(), mu.end(), mean);
  }
  return status;
}

template int64_t first_nonfinite<float>(const RowView<float>&);
template int64_t first_nonfinite<double>(const RowView<double>&);
template void syrk_upper_cpu<float>(const RowView<float>&, const double*, double*, int);
template void syrk_upper_cpu<double>(const RowView<double>&, const double*, double*, int);
template GramianStatus gramian_update_cpu<float, float>(const RowView<float>&, const RowView<float>&, int64_t, double*, double*,
                                               double*, int);
template GramianStatus gramian_update_cpu<float, double>(const RowView<float>&, const RowView<double>&, int64_t, double*,
                                                double*, double*, int);
template GramianStatus gramian_update_cpu<double, float>(const RowView<double>&, const RowView<float>&, int64_t, double*,
                                                double*, double*, int);
template GramianStatus gramian_update_cpu<double, double>(const RowView<double>&, const RowView<double>&, int64_t, double*,
                                                 double*, double*, int);

}  // namespace wtc
