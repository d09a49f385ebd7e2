#include "dt_mlp.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace wtc {
namespace {

#define WTC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
// helpers are forced inline so each clone compiles them for its own target (a call would reach a
// baseline-x86-64 copy: measured 15x slower on the SiLU units)
#define WTC_INLINE inline __attribute__((always_inline))

constexpr int64_t NB = 64;   // rows per block (the vectorised axis); a last partial block is zero-padded

// exp(x), branch-free (Cephes' expf: range reduction by ln 2, degree-5 polynomial, within 2 ulp),
// x clamped to [-87, 88] so 2^k stays a normal float.
WTC_INLINE float exp_f(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
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

// The activation of hidden unit u on a block: out = act(pre); with `deriv`, d act / d pre too.
enum Act { RELU = 0, SILU = 1, GELU = 2, TANH = 3, RELU_SILU = 4 };

WTC_INLINE int unit_act(int act, int64_t u, int64_t hidden) {
  return act == RELU_SILU ? (u < hidden / 2 ? RELU : SILU) : act;
}

template <bool DERIV>
WTC_INLINE void activate_t(int act, const float* pre, float* out, float* deriv) {
  switch (act) {
    case RELU:
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) {
        out[t] = pre[t] > 0.0f ? pre[t] : 0.0f;
        if (DERIV) deriv[t] = pre[t] > 0.0f ? 1.0f : 0.0f;
      }
      break;
    case SILU:
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) {
        const float sg = 1.0f / (1.0f + exp_f(-pre[t]));
        out[t] = pre[t] * sg;
        if (DERIV) deriv[t] = sg * (1.0f + pre[t] * (1.0f - sg));
      }
      break;
    case GELU:
      for (int64_t t = 0; t < NB; ++t) {
        const float h = pre[t];
        const float cdf = 0.5f * (1.0f + std::erf(h * 0.7071067811865476f));
        out[t] = h * cdf;
        if (DERIV) deriv[t] = cdf + h * 0.3989422804014327f * std::exp(-0.5f * h * h);
      }
      break;
    default:   // TANH
      for (int64_t t = 0; t < NB; ++t) {
        const float th = std::tanh(pre[t]);
        out[t] = th;
        if (DERIV) deriv[t] = 1.0f - th * th;
      }
  }
}

WTC_INLINE void activate(int act, const float* pre, float* out, float* deriv) {
  if (deriv != nullptr) activate_t<true>(act, pre, out, deriv);
  else activate_t<false>(act, pre, out, deriv);
}

struct Block {
  std::vector<float> xT, pre1, a1, d1, pre2, a2, d2, yacc, dyb, dxT, dlast, da1;
  Block(const DtMlpShapes& s)
      : xT(s.k * NB), pre1(s.hidden * NB), a1(s.hidden * NB), d1(s.hidden * NB), pre2(s.hidden * NB),
        a2(s.hidden * NB), d2(s.hidden * NB), yacc(NB), dyb(NB), dxT(s.k * NB), dlast(s.hidden * NB),
        da1(s.hidden * NB) {}
};

// Hidden layers of rows row0 .. row0 + NB of pair (r, m) into b (pre-activations, activations and
// their derivatives when `deriv`); rows past n read as zeros.
WTC_INLINE void hidden_layers(const DtMlpShapes& s, const float* x, const DtMlpParams& p, int64_t r, int64_t m,
                   int64_t row0, Block& b, bool deriv) {
  const int64_t k = s.k, Hd = s.hidden, M = s.M, rm = r * M + m;
  const int64_t cur = std::min(NB, s.n - row0);
  for (int64_t c = 0; c < k; ++c)
    for (int64_t t = 0; t < NB; ++t) b.xT[c * NB + t] = t < cur ? x[((r * s.n + row0 + t) * M + m) * k + c] : 0.0f;
  const float* W1 = p.W1 + rm * Hd * k;
  const float* b1 = p.b1 + rm * Hd;
  for (int64_t u = 0; u < Hd; ++u) {
    float* pre = b.pre1.data() + u * NB;
    const float bias = b1[u];
#pragma omp simd
    for (int64_t t = 0; t < NB; ++t) pre[t] = 0.0f;
    for (int64_t c = 0; c < k; ++c) {
      const float w = W1[u * k + c];
      const float* xc = b.xT.data() + c * NB;
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) pre[t] += w * xc[t];
    }
#pragma omp simd
    for (int64_t t = 0; t < NB; ++t) pre[t] += bias;
    activate(unit_act(s.act, u, Hd), pre, b.a1.data() + u * NB, deriv ? b.d1.data() + u * NB : nullptr);
  }
  if (s.depth != 2) return;
  const float* Wm = p.W_mid + rm * Hd * Hd;
  const float* bm = p.b_mid + rm * Hd;
  for (int64_t u = 0; u < Hd; ++u) {
    float* pre = b.pre2.data() + u * NB;
#pragma omp simd
    for (int64_t t = 0; t < NB; ++t) pre[t] = 0.0f;
    for (int64_t v = 0; v < Hd; ++v) {
      const float w = Wm[u * Hd + v];
      const float* a = b.a1.data() + v * NB;
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) pre[t] += w * a[t];
    }
    const float bias = bm[u];
#pragma omp simd
    for (int64_t t = 0; t < NB; ++t) pre[t] += bias;
    activate(unit_act(s.act, u, Hd), pre, b.a2.data() + u * NB, deriv ? b.d2.data() + u * NB : nullptr);
  }
}

WTC_CLONES void forward_pair(const DtMlpShapes& s, const float* x, const DtMlpParams& p, float* y, int64_t r,
                             int64_t m, Block& b) {
  const int64_t k = s.k, Hd = s.hidden, M = s.M, rm = r * M + m;
  const float* W2 = p.W2 + rm * Hd;
  const float* skip = p.skip + rm * k;
  for (int64_t row0 = 0; row0 < s.n; row0 += NB) {
    hidden_layers(s, x, p, r, m, row0, b, false);
    const float* last = s.depth == 2 ? b.a2.data() : b.a1.data();
    float* acc = b.yacc.data();
    for (int64_t t = 0; t < NB; ++t) acc[t] = 0.0f;
    for (int64_t u = 0; u < Hd; ++u) {
      const float w = W2[u];
      const float* a = last + u * NB;
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) acc[t] += w * a[t];
    }
    const float b2 = p.b2[rm];
#pragma omp simd
    for (int64_t t = 0; t < NB; ++t) acc[t] += b2;
    for (int64_t c = 0; c < k; ++c) {
      const float w = skip[c];
      const float* xc = b.xT.data() + c * NB;
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) acc[t] += w * xc[t];
    }
    const int64_t cur = std::min(NB, s.n - row0);
    for (int64_t t = 0; t < cur; ++t) y[(r * s.n + row0 + t) * M + m] = acc[t];
  }
}

WTC_INLINE float dot_nb(const float* a, const float* c) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t t = 0; t < NB; ++t) acc += a[t] * c[t];
  return acc;
}

WTC_INLINE float sum_nb(const float* a) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t t = 0; t < NB; ++t) acc += a[t];
  return acc;
}

WTC_CLONES void backward_pair(const DtMlpShapes& s, const float* x, const DtMlpParams& p, const float* dy,
                              const DtMlpGrads& g, int64_t r, int64_t m, Block& b) {
  const int64_t k = s.k, Hd = s.hidden, M = s.M, rm = r * M + m;
  const float* W1 = p.W1 + rm * Hd * k;
  const float* W2 = p.W2 + rm * Hd;
  const float* skip = p.skip + rm * k;
  float* dW1 = g.dW1 + rm * Hd * k;
  float* db1 = g.db1 + rm * Hd;
  float* dW2 = g.dW2 + rm * Hd;
  float* dskip = g.dskip + rm * k;
  std::fill(dW1, dW1 + Hd * k, 0.0f);
  std::fill(db1, db1 + Hd, 0.0f);
  std::fill(dW2, dW2 + Hd, 0.0f);
  std::fill(dskip, dskip + k, 0.0f);
  float db2 = 0.0f;
  float *dWm = nullptr, *dbm = nullptr;
  if (s.depth == 2) {
    dWm = g.dW_mid + rm * Hd * Hd;
    dbm = g.db_mid + rm * Hd;
    std::fill(dWm, dWm + Hd * Hd, 0.0f);
    std::fill(dbm, dbm + Hd, 0.0f);
  }
  for (int64_t row0 = 0; row0 < s.n; row0 += NB) {
    hidden_layers(s, x, p, r, m, row0, b, true);
    const int64_t cur = std::min(NB, s.n - row0);
    float* d = b.dyb.data();
    for (int64_t t = 0; t < NB; ++t) d[t] = t < cur ? dy[(r * s.n + row0 + t) * M + m] : 0.0f;
    db2 += sum_nb(d);
    for (int64_t c = 0; c < k; ++c) {
      const float* xc = b.xT.data() + c * NB;
      float* dxc = b.dxT.data() + c * NB;
      dskip[c] += dot_nb(d, xc);
      const float w = skip[c];
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) dxc[t] = w * d[t];
    }
    // the last hidden layer: d pre = W2 * dy * act'
    const float* last = s.depth == 2 ? b.a2.data() : b.a1.data();
    const float* dlast_act = s.depth == 2 ? b.d2.data() : b.d1.data();
    for (int64_t u = 0; u < Hd; ++u) {
      dW2[u] += dot_nb(last + u * NB, d);
      const float w = W2[u];
      float* dl = b.dlast.data() + u * NB;
      const float* da = dlast_act + u * NB;
#pragma omp simd
      for (int64_t t = 0; t < NB; ++t) dl[t] = w * d[t] * da[t];
    }
    const float* dpre1 = b.dlast.data();
    if (s.depth == 2) {
      const float* Wm = p.W_mid + rm * Hd * Hd;
      std::fill(b.da1.begin(), b.da1.end(), 0.0f);
      for (int64_t u = 0; u < Hd; ++u) {
        const float* dl = b.dlast.data() + u * NB;
        dbm[u] += sum_nb(dl);
        for (int64_t v = 0; v < Hd; ++v) {
          dWm[u * Hd + v] += dot_nb(dl, b.a1.data() + v * NB);
          const float w = Wm[u * Hd + v];
          float* da = b.da1.data() + v * NB;
#pragma omp simd
          for (int64_t t = 0; t < NB; ++t) da[t] += w * dl[t];
        }
      }
      for (int64_t v = 0; v < Hd; ++v) {
        float* da = b.da1.data() + v * NB;
        const float* d1 = b.d1.data() + v * NB;
#pragma omp simd
        for (int64_t t = 0; t < NB; ++t) da[t] *= d1[t];
      }
      dpre1 = b.da1.data();
    }
    for (int64_t u = 0; u < Hd; ++u) {
      const float* dp = dpre1 + u * NB;
      db1[u] += sum_nb(dp);
      for (int64_t c = 0; c < k; ++c) {
        dW1[u * k + c] += dot_nb(dp, b.xT.data() + c * NB);
        const float w = W1[u * k + c];
        float* dxc = b.dxT.data() + c * NB;
#pragma omp simd
        for (int64_t t = 0; t < NB; ++t) dxc[t] += w * dp[t];
      }
    }
    for (int64_t c = 0; c < k; ++c)
      for (int64_t t = 0; t < cur; ++t) g.dx[((r * s.n + row0 + t) * M + m) * k + c] = b.dxT[c * NB + t];
  }
  g.db2[rm] = db2;
}

}  // namespace

void dt_mlp_forward(const DtMlpShapes& s, const float* x, const DtMlpParams& p, float* y, int threads) {
#pragma omp parallel num_threads(std::max(1, threads))
  {
    Block b(s);
#pragma omp for schedule(static)
    for (int64_t rm = 0; rm < s.R * s.M; ++rm) forward_pair(s, x, p, y, rm / s.M, rm % s.M, b);
  }
}

void dt_mlp_backward(const DtMlpShapes& s, const float* x, const DtMlpParams& p, const float* dy,
                     const DtMlpGrads& g, int threads) {
#pragma omp parallel num_threads(std::max(1, threads))
  {
    Block b(s);
#pragma omp for schedule(static)
    for (int64_t rm = 0; rm < s.R * s.M; ++rm) backward_pair(s, x, p, dy, g, rm / s.M, rm % s.M, b);
  }
}

}  // namespace wtc
