#include "dt_mlp.h"

#include "dt_isa.h"
#include "flush_denormals.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace wtc {
namespace {

// helpers are forced inline so each ISA's copy of the entry points (bottom of this file, dt_isa.h)
// compiles them for its own target (a call would reach a baseline-x86-64 copy: measured 15x slower
// on the SiLU units)
#define WTC_INLINE inline __attribute__((always_inline))

constexpr int64_t NB = 64;   // rows per block (the vectorised axis); a last partial block is zero-padded

// exp(x), branch-free (Cephes' expf: range reduction by ln 2, degree-5 polynomial, within 2 ulp),
// x clamped to [-87, 87] so 2^k stays a normal float (clamp_abs, dt_isa.h: a float comparison would
// keep the SiLU loops scalar on AVX2).
WTC_INLINE float exp_f(float x) {
  x = clamp_abs(x, 87.0f);
  const float y = x * 1.44269504088896341f;
  const float kk = (y + 12582912.0f) - 12582912.0f;        // round to nearest
  float r = x - kk * 0.693359375f;
  r = r - kk * -2.12194440e-4f;
  float q = 1.9875691500e-4f;
  q = q * r + 1.3981999507e-3f;
  q = q * r + 8.3334519073e-3f;
  q = q * r + 4.1665795894e-2f;
  q = q * r + 1.6666665459e-1f;
  q = q * r + 5.0000001201e-1f;
  q = q * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(kk) + 127) << 23;
  return q * __builtin_bit_cast(float, bits);
}

// exp(x) in double, branch-free (Cody-Waite reduction by ln 2, Taylor series to r^13 on
// |r| <= ln2 / 2: truncation below 1e-17 relative), x clamped to [-708, 708]; the float64 path of the
// precision pass, where std::exp does not vectorise without fast-math. 2^k is built from the bits of
// the rounding sum (k in its low mantissa bits): AVX2 has no double -> int64 conversion, and a cast
// kept this loop scalar there.
WTC_INLINE double exp_d(double x) {
  x = clamp_abs(x, 708.0);
  const double shifted = x * 1.4426950408889634 + 6755399441055744.0;   // 1.5 * 2^52 + k
  const double kk = shifted - 6755399441055744.0;                       // round to nearest
  double r = x - kk * 6.93145751953125e-1;
  r = r - kk * 1.42860682030941723212e-6;
  double q = 1.0 / 6227020800.0;                        // 1/13!
  q = q * r + 1.0 / 479001600.0;
  q = q * r + 1.0 / 39916800.0;
  q = q * r + 1.0 / 3628800.0;
  q = q * r + 1.0 / 362880.0;
  q = q * r + 1.0 / 40320.0;
  q = q * r + 1.0 / 5040.0;
  q = q * r + 1.0 / 720.0;
  q = q * r + 1.0 / 120.0;
  q = q * r + 1.0 / 24.0;
  q = q * r + 1.0 / 6.0;
  q = q * r + 0.5;
  q = q * r * r + r + 1.0;
  const int64_t k = __builtin_bit_cast(int64_t, shifted) - __builtin_bit_cast(int64_t, 6755399441055744.0);
  const int64_t bits = (k + 1023) << 52;
  return q * __builtin_bit_cast(double, bits);
}

WTC_INLINE float exp_t(float x) { return exp_f(x); }
WTC_INLINE double exp_t(double x) { return exp_d(x); }

// The activation of hidden unit u on a block: out = act(pre); with `deriv`, d act / d pre too.
enum Act { RELU = 0, SILU = 1, GELU = 2, TANH = 3, RELU_SILU = 4 };

WTC_INLINE int unit_act(int act, int64_t u, int64_t hidden) {
  return act == RELU_SILU ? (u < hidden / 2 ? RELU : SILU) : act;
}

template <bool DERIV, typename T>
WTC_INLINE void activate_t(int act, const T* pre, T* out, T* deriv) {
  const T zero = T(0), one = T(1);
  switch (act) {
    case RELU:
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) {
        out[t] = pre[t] > zero ? pre[t] : zero;
        if (DERIV) deriv[t] = pre[t] > zero ? one : zero;
      }
      break;
    case SILU:
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) {
        const T sg = one / (one + exp_t(-pre[t]));
        out[t] = pre[t] * sg;
        if (DERIV) deriv[t] = sg * (one + pre[t] * (one - sg));
      }
      break;
    case GELU:
      for (int64_t t = 0; t < NB; ++t) {
        const T h = pre[t];
        const T cdf = T(0.5) * (one + std::erf(h * T(0.7071067811865476)));
        out[t] = h * cdf;
        if (DERIV) deriv[t] = cdf + h * T(0.3989422804014327) * std::exp(T(-0.5) * h * h);
      }
      break;
    default:   // TANH
      for (int64_t t = 0; t < NB; ++t) {
        const T th = std::tanh(pre[t]);
        out[t] = th;
        if (DERIV) deriv[t] = one - th * th;
      }
  }
}

template <typename T>
WTC_INLINE void activate(int act, const T* pre, T* out, T* deriv) {
  if (deriv != nullptr) activate_t<true>(act, pre, out, deriv);
  else activate_t<false>(act, pre, out, deriv);
}

template <typename T>
struct Block {
  std::vector<T> xT, pre1, a1, d1, pre2, a2, d2, yacc, dyb, dxT, dlast, da1;
  Block(const DtMlpShapes& s)
      : xT(s.k * NB), pre1(s.hidden * NB), a1(s.hidden * NB), d1(s.hidden * NB), pre2(s.hidden * NB),
        a2(s.hidden * NB), d2(s.hidden * NB), yacc(NB), dyb(NB), dxT(s.k * NB), dlast(s.hidden * NB),
        da1(s.hidden * NB) {}
};

// Hidden layers of rows row0 .. row0 + NB of pair (r, m) into b (pre-activations, activations and
// their derivatives when `deriv`); rows past n read as zeros.
template <typename T>
WTC_INLINE void hidden_layers(const DtMlpShapes& s, const T* x, const DtMlpParamsT<T>& p, int64_t r, int64_t m,
                              int64_t row0, Block<T>& b, bool deriv) {
  const int64_t k = s.k, Hd = s.hidden, M = s.M, rm = r * M + m;
  const int64_t cur = std::min(NB, s.n - row0);
  for (int64_t c = 0; c < k; ++c)
    for (int64_t t = 0; t < NB; ++t) b.xT[c * NB + t] = t < cur ? x[((r * s.n + row0 + t) * M + m) * k + c] : T(0);
  const T* W1 = p.W1 + rm * Hd * k;
  const T* b1 = p.b1 + rm * Hd;
  for (int64_t u = 0; u < Hd; ++u) {
    T* pre = b.pre1.data() + u * NB;
    const T bias = b1[u];
#pragma omp simd
    for (int64_t t = 0; t < NB; ++t) pre[t] = T(0);
    for (int64_t c = 0; c < k; ++c) {
      const T w = W1[u * k + c];
      const T* xc = b.xT.data() + c * NB;
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) pre[t] += w * xc[t];
    }
#pragma omp simd
    for (int64_t t = 0; t < NB; ++t) pre[t] += bias;
    activate(unit_act(s.act, u, Hd), pre, b.a1.data() + u * NB, deriv ? b.d1.data() + u * NB : nullptr);
  }
  if (s.depth != 2) return;
  const T* Wm = p.W_mid + rm * Hd * Hd;
  const T* bm = p.b_mid + rm * Hd;
  for (int64_t u = 0; u < Hd; ++u) {
    T* pre = b.pre2.data() + u * NB;
#pragma omp simd
    for (int64_t t = 0; t < NB; ++t) pre[t] = T(0);
    for (int64_t v = 0; v < Hd; ++v) {
      const T w = Wm[u * Hd + v];
      const T* a = b.a1.data() + v * NB;
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) pre[t] += w * a[t];
    }
    const T bias = bm[u];
#pragma omp simd
    for (int64_t t = 0; t < NB; ++t) pre[t] += bias;
    activate(unit_act(s.act, u, Hd), pre, b.a2.data() + u * NB, deriv ? b.d2.data() + u * NB : nullptr);
  }
}

template <typename T>
WTC_INLINE void forward_pair_t(const DtMlpShapes& s, const T* x, const DtMlpParamsT<T>& p, T* y, int64_t r,
                               int64_t m, Block<T>& b) {
  const int64_t k = s.k, Hd = s.hidden, M = s.M, rm = r * M + m;
  const T* W2 = p.W2 + rm * Hd;
  const T* skip = p.skip + rm * k;
  for (int64_t row0 = 0; row0 < s.n; row0 += NB) {
    hidden_layers(s, x, p, r, m, row0, b, false);
    const T* last = s.depth == 2 ? b.a2.data() : b.a1.data();
    T* acc = b.yacc.data();
    for (int64_t t = 0; t < NB; ++t) acc[t] = T(0);
    for (int64_t u = 0; u < Hd; ++u) {
      const T w = W2[u];
      const T* a = last + u * NB;
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) acc[t] += w * a[t];
    }
    const T b2 = p.b2[rm];
#pragma omp simd
    for (int64_t t = 0; t < NB; ++t) acc[t] += b2;
    for (int64_t c = 0; c < k; ++c) {
      const T w = skip[c];
      const T* xc = b.xT.data() + c * NB;
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) acc[t] += w * xc[t];
    }
    const int64_t cur = std::min(NB, s.n - row0);
    for (int64_t t = 0; t < cur; ++t) y[(r * s.n + row0 + t) * M + m] = acc[t];
  }
}

template <typename T>
WTC_INLINE T dot_nb(const T* a, const T* c) {
  T acc = T(0);
#pragma omp simd reduction(+ : acc)
  for (int64_t t = 0; t < NB; ++t) acc += a[t] * c[t];
  return acc;
}

template <typename T>
WTC_INLINE T sum_nb(const T* a) {
  T acc = T(0);
#pragma omp simd reduction(+ : acc)
  for (int64_t t = 0; t < NB; ++t) acc += a[t];
  return acc;
}

template <typename T>
WTC_INLINE void backward_pair_t(const DtMlpShapes& s, const T* x, const DtMlpParamsT<T>& p, const T* dy,
                                const DtMlpGradsT<T>& g, int64_t r, int64_t m, Block<T>& b) {
  const int64_t k = s.k, Hd = s.hidden, M = s.M, rm = r * M + m;
  const T* W1 = p.W1 + rm * Hd * k;
  const T* W2 = p.W2 + rm * Hd;
  const T* skip = p.skip + rm * k;
  T* dW1 = g.dW1 + rm * Hd * k;
  T* db1 = g.db1 + rm * Hd;
  T* dW2 = g.dW2 + rm * Hd;
  T* dskip = g.dskip + rm * k;
  std::fill(dW1, dW1 + Hd * k, T(0));
  std::fill(db1, db1 + Hd, T(0));
  std::fill(dW2, dW2 + Hd, T(0));
  std::fill(dskip, dskip + k, T(0));
  T db2 = T(0);
  T *dWm = nullptr, *dbm = nullptr;
  if (s.depth == 2) {
    dWm = g.dW_mid + rm * Hd * Hd;
    dbm = g.db_mid + rm * Hd;
    std::fill(dWm, dWm + Hd * Hd, T(0));
    std::fill(dbm, dbm + Hd, T(0));
  }
  for (int64_t row0 = 0; row0 < s.n; row0 += NB) {
    hidden_layers(s, x, p, r, m, row0, b, true);
    const int64_t cur = std::min(NB, s.n - row0);
    T* d = b.dyb.data();
    for (int64_t t = 0; t < NB; ++t) d[t] = t < cur ? dy[(r * s.n + row0 + t) * M + m] : T(0);
    db2 += sum_nb(d);
    for (int64_t c = 0; c < k; ++c) {
      const T* xc = b.xT.data() + c * NB;
      T* dxc = b.dxT.data() + c * NB;
      dskip[c] += dot_nb(d, xc);
      const T w = skip[c];
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) dxc[t] = w * d[t];
    }
    // the last hidden layer: d pre = W2 * dy * act'
    const T* last = s.depth == 2 ? b.a2.data() : b.a1.data();
    const T* dlast_act = s.depth == 2 ? b.d2.data() : b.d1.data();
    for (int64_t u = 0; u < Hd; ++u) {
      dW2[u] += dot_nb(last + u * NB, d);
      const T w = W2[u];
      T* dl = b.dlast.data() + u * NB;
      const T* da = dlast_act + u * NB;
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) dl[t] = w * d[t] * da[t];
    }
    const T* dpre1 = b.dlast.data();
    if (s.depth == 2) {
      const T* Wm = p.W_mid + rm * Hd * Hd;
      std::fill(b.da1.begin(), b.da1.end(), T(0));
      for (int64_t u = 0; u < Hd; ++u) {
        const T* dl = b.dlast.data() + u * NB;
        dbm[u] += sum_nb(dl);
        for (int64_t v = 0; v < Hd; ++v) {
          dWm[u * Hd + v] += dot_nb(dl, b.a1.data() + v * NB);
          const T w = Wm[u * Hd + v];
          T* da = b.da1.data() + v * NB;
#pragma omp simd
          for (int64_t t = 0; t < NB; ++t) da[t] += w * dl[t];
        }
      }
      for (int64_t v = 0; v < Hd; ++v) {
        T* da = b.da1.data() + v * NB;
        const T* d1 = b.d1.data() + v * NB;
#pragma omp simd
        for (int64_t t = 0; t < NB; ++t) da[t] *= d1[t];
      }
      dpre1 = b.da1.data();
    }
    for (int64_t u = 0; u < Hd; ++u) {
      const T* dp = dpre1 + u * NB;
      db1[u] += sum_nb(dp);
      for (int64_t c = 0; c < k; ++c) {
        dW1[u * k + c] += dot_nb(dp, b.xT.data() + c * NB);
        const T w = W1[u * k + c];
        T* dxc = b.dxT.data() + c * NB;
#pragma omp simd
        for (int64_t t = 0; t < NB; ++t) dxc[t] += w * dp[t];
      }
    }
    for (int64_t c = 0; c < k; ++c)
      for (int64_t t = 0; t < cur; ++t) g.dx[((r * s.n + row0 + t) * M + m) * k + c] = b.dxT[c * NB + t];
  }
  g.db2[rm] = db2;
}

// ---- one copy of the entry points per instruction set (dt_isa.h), for float and double
template <typename T>
struct MlpFns {
  void (*forward_pair)(const DtMlpShapes&, const T*, const DtMlpParamsT<T>&, T*, int64_t, int64_t, Block<T>&);
  void (*backward_pair)(const DtMlpShapes&, const T*, const DtMlpParamsT<T>&, const T*, const DtMlpGradsT<T>&,
                        int64_t, int64_t, Block<T>&);
};

#define WTC_MLP_COPY(ISA, TARGET)                                                                                 \
  template <typename T>                                                                                           \
  TARGET void forward_pair_##ISA(const DtMlpShapes& s, const T* x, const DtMlpParamsT<T>& p, T* y, int64_t r,     \
                                 int64_t m, Block<T>& b) {                                                        \
    forward_pair_t(s, x, p, y, r, m, b);                                                                          \
  }                                                                                                               \
  template <typename T>                                                                                           \
  TARGET void backward_pair_##ISA(const DtMlpShapes& s, const T* x, const DtMlpParamsT<T>& p, const T* dy,        \
                                  const DtMlpGradsT<T>& g, int64_t r, int64_t m, Block<T>& b) {                   \
    backward_pair_t(s, x, p, dy, g, r, m, b);                                                                     \
  }

WTC_MLP_COPY(portable, )
#ifdef WTC_DT_DISPATCH
WTC_MLP_COPY(avx2, WTC_DT_TARGET("arch=x86-64-v3"))
WTC_MLP_COPY(avx512, WTC_DT_TARGET("arch=x86-64-v4"))
#endif

template <typename T>
MlpFns<T> mlp_fns() {
#ifdef WTC_DT_DISPATCH
  switch (dt_isa()) {
    case kDtIsaAvx512: return {forward_pair_avx512<T>, backward_pair_avx512<T>};
    case kDtIsaAvx2: return {forward_pair_avx2<T>, backward_pair_avx2<T>};
    default: break;
  }
#endif
  return {forward_pair_portable<T>, backward_pair_portable<T>};
}

}  // namespace

template <typename T>
void dt_mlp_forward(const DtMlpShapes& s, const T* x, const DtMlpParamsT<T>& p, T* y, int threads) {
  const MlpFns<T> fns = mlp_fns<T>();
#pragma omp parallel num_threads(std::max(1, threads))
  {
    FlushDenormals ftz;
    Block<T> b(s);
#pragma omp for schedule(static)
    for (int64_t rm = 0; rm < s.R * s.M; ++rm) fns.forward_pair(s, x, p, y, rm / s.M, rm % s.M, b);
  }
}

template <typename T>
void dt_mlp_backward(const DtMlpShapes& s, const T* x, const DtMlpParamsT<T>& p, const T* dy,
                     const DtMlpGradsT<T>& g, int threads) {
  const MlpFns<T> fns = mlp_fns<T>();
#pragma omp parallel num_threads(std::max(1, threads))
  {
    FlushDenormals ftz;
    Block<T> b(s);
#pragma omp for schedule(static)
    for (int64_t rm = 0; rm < s.R * s.M; ++rm) fns.backward_pair(s, x, p, dy, g, rm / s.M, rm % s.M, b);
  }
}

template void dt_mlp_forward<float>(const DtMlpShapes&, const float*, const DtMlpParamsT<float>&, float*, int);
template void dt_mlp_forward<double>(const DtMlpShapes&, const double*, const DtMlpParamsT<double>&, double*, int);
template void dt_mlp_backward<float>(const DtMlpShapes&, const float*, const DtMlpParamsT<float>&, const float*,
                                     const DtMlpGradsT<float>&, int);
template void dt_mlp_backward<double>(const DtMlpShapes&, const double*, const DtMlpParamsT<double>&, const double*,
                                      const DtMlpGradsT<double>&, int);

}  // namespace wtc
