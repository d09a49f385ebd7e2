#include "dt_route.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dt_isa.h"
#include "flush_denormals.h"
#include "noise.h"

namespace wtc {
namespace {

// helpers are forced inline so each ISA's copy of the entry points (bottom of this file, dt_isa.h)
// compiles them for its own target
#define WTC_INLINE inline __attribute__((always_inline))

// 16 floats as two 8-float vectors, summed in registers (a float[16] accumulator went through the
// stack on AVX2, each step waiting on the last one's store: measured, the forward's hottest loop).
// GCC lowers an 8-float vector to one ymm (AVX2, AVX-512) or two xmm (portable); a 16-float one
// broadcast its scalar factors through memory on AVX2 (measured: a 2x slower backward).
typedef float F8 __attribute__((vector_size(32), aligned(4), may_alias));
struct F16 {
  F8 lo, hi;
};
WTC_INLINE F16 zero16() { return {F8{}, F8{}}; }
WTC_INLINE F16 load16(const float* p) {
  return {*reinterpret_cast<const F8*>(p), *reinterpret_cast<const F8*>(p + 8)};
}
WTC_INLINE void store16(float* p, const F16& v) {
  *reinterpret_cast<F8*>(p) = v.lo;
  *reinterpret_cast<F8*>(p + 8) = v.hi;
}
WTC_INLINE void fma16(F16& acc, float a, const float* x) {   // acc += a * x[0:16]
  acc.lo += a * *reinterpret_cast<const F8*>(x);
  acc.hi += a * *reinterpret_cast<const F8*>(x + 8);
}

// exp(x) for the softmax (x = z / tau - max <= 0), branch-free so loops over keys vectorise:
// Cephes' expf (range reduction by ln 2, degree-5 polynomial), within 2 ulp of expf; x below -87
// gives exp(-87) ~ 1.6e-38 instead of a denormal, which no probability here can tell apart. The
// clamp is clamp_abs (dt_isa.h): a float comparison would keep this loop scalar on AVX2.
WTC_INLINE float exp_neg(float x) {
  x = clamp_abs(x, 87.0f);
  const float y = x * 1.44269504088896341f;
  const float k = (y + 12582912.0f) - 12582912.0f;        // round to nearest (1.5 * 2^23 trick)
  float r = x - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  return p * __builtin_bit_cast(float, bits);
}

// Rows of keys are padded to Lp (a multiple of 16) and computed full width, masked: the loops over
// keys then vectorise completely (most rows hold fewer than 16 visible keys, which would otherwise
// run as scalar remainder loops).
inline int64_t padded(int64_t L) { return (L + 15) / 16 * 16; }

// Everything one (replica, sequence) pair needs, for all of its H heads: scores before the scale,
// probabilities, argmax keys, and the PLE codes / query projections of the content term. What the
// backward reads (pre, p, encq, proj, enck, valp, arg: unit_floats) lives in one block, bound to the
// Unit's own storage or, when the forward keeps its work, to the pair's region of the kept buffer:
// the forward computes into it and the backward reads it there, nothing copied.
inline int64_t unit_floats(const DtRouteShapes& s) {
  const int64_t H = s.H, T = s.T, Lp = padded(s.L);
  return 2 * H * T * Lp + 2 * H * T * s.N + H * s.L * s.N + H * Lp + H * T;
}

struct Unit {
  int64_t Lp;
  std::vector<float> noise, enckT, rrev, abp, row;
  // the causal mask as data, not as a comparison in the key loops (GCC splits a loop at `j <= last`
  // and then vectorises neither part): valid 1 / 0, bias 0 / -inf, per (query, key)
  std::vector<float> valid, bias;
  std::vector<float> own;
  float *pre, *p, *encq, *proj, *enck, *valp;
  int32_t* arg;
  int64_t HTL, HTN, HLN, HL;   // the block's sizes: H T Lp, H T N, H L N, H Lp
  explicit Unit(const DtRouteShapes& s)
      : Lp(padded(s.L)), noise(s.T * s.L + Lp), enckT(s.H * s.N * Lp), rrev(s.H * (s.L + Lp)), abp(s.H * Lp),
        row(Lp), valid(s.T * Lp), bias(s.T * Lp), own(unit_floats(s)), HTL(s.H * s.T * Lp), HTN(s.H * s.T * s.N),
        HLN(s.H * s.L * s.N), HL(s.H * Lp) {
    for (int64_t i = 0; i < s.T; ++i)
      for (int64_t j = 0; j < Lp; ++j) {
        const bool ok = j <= i + s.pad;
        valid[i * Lp + j] = ok ? 1.0f : 0.0f;
        bias[i * Lp + j] = ok ? 0.0f : -std::numeric_limits<float>::infinity();
      }
    bind(own.data());
  }
  // the block at base (unit_floats floats): own.data() or a region of the kept buffer
  void bind(float* base) {
    pre = base;
    p = pre + HTL;
    encq = p + HTL;
    proj = encq + HTN;
    enck = proj + HTN;
    valp = enck + HLN;
    arg = reinterpret_cast<int32_t*>(valp + HL);   // H T argmax keys, their bits in floats' room
  }
};

// The PLE clamps by integer operations on the bits, as clamp_abs (dt_isa.h): a float comparison keeps
// these loops scalar on AVX2. A float's bits order as signed integers where it is >= 0, a negative
// float's bits are negative, and zn - t is never -0 for t >= 1 (the first bin is not floored); NaN
// stays NaN (a NaN code, no gradient), as in torch.
constexpr int32_t kOneBits = 0x3f800000;    // 1.0f

WTC_INLINE bool is_nan_bits(int32_t b) { return (b & 0x7fffffff) > 0x7f800000; }

// PLE of z on N equal bins of [0, 1], as wtc.dt.ple.ple_uniform: (z * N) - t clamped to [0, 1], the
// first bin not floored, the last not capped.
WTC_INLINE void ple(float z, int64_t N, float* code) {
  const float zn = z * static_cast<float>(N);
#pragma omp simd
  for (int64_t t = 0; t < N; ++t) {
    const int32_t b = __builtin_bit_cast(int32_t, zn - static_cast<float>(t));
    int32_t c = t > 0 ? b & ~(b >> 31) : b;                  // max(x, 0): a negative's bits -> 0
    const int32_t cap = t < N - 1 ? kOneBits : INT32_MAX;
    c = c < cap ? c : cap;                                   // min(x, 1)
    code[t] = __builtin_bit_cast(float, is_nan_bits(b) ? b : c);
  }
}

// d code / d z summed against dcode: torch.clamp passes the gradient where lo <= c <= hi.
WTC_INLINE float ple_grad(float z, int64_t N, const float* dcode) {
  const float zn = z * static_cast<float>(N);
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t t = 0; t < N; ++t) {
    const int32_t b = __builtin_bit_cast(int32_t, zn - static_cast<float>(t));
    const bool live = (t == 0 || b >= 0) && (t == N - 1 || b <= kOneBits) && !is_nan_bits(b);
    acc += live ? dcode[t] : 0.0f;
  }
  return acc * static_cast<float>(N);
}

// Fill `u` for pair (r, b): every head's scores, probabilities and (hard) argmax keys; entries
// past a query's last key are 0 (pre, p).
// NC: the PLE bins as a compile-time constant (16, the default; the loops over bins become single
// vectors) or 0 (any number, read from s.N).
template <int NC, bool Vec>
WTC_INLINE void recompute(const DtRouteShapes& s, const DtRouteInputs& in, int64_t r, int64_t b, Unit& u) {
  const int64_t H = s.H, T = s.T, L = s.L, N = NC > 0 ? NC : s.N, P = s.pad, Lp = u.Lp;
  const float cr = in.content[r], itau = in.inv_tau;
  const bool hard = in.hard, noise = in.noise;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = (r * s.B + b) * H + h, rh = r * H + h;
    float* pre = u.pre + h * T * Lp;
    float* p = u.p + h * T * Lp;
    float* encq = u.encq + h * T * N;
    float* enck = u.enck + h * L * N;
    float* enckT = u.enckT.data() + h * N * Lp;
    float* proj = u.proj + h * T * N;
    float* rrev = u.rrev.data() + h * (L + Lp);    // rel[i + P - j] = rrev[L - 1 - i - P + j]
    float* abp = u.abp.data() + h * Lp;
    float* valp = u.valp + h * Lp;
    const float sc = in.scale[rh];
    for (int64_t k = 0; k < L + Lp; ++k) rrev[k] = k < L ? in.rel[rh * L + L - 1 - k] : 0.0f;
    for (int64_t j = 0; j < Lp; ++j) {
      abp[j] = j < L ? in.abs_[rh * L + j] : 0.0f;
      valp[j] = j < L ? in.val[g * L + j] : 0.0f;
    }
    if (cr != 0.0f) {
      const float* W = in.W + rh * N * N;
      const float* uu = in.u + rh * N;
      for (int64_t i = 0; i < T; ++i) ple(in.zq[g * T + i], N, encq + i * N);
      for (int64_t c = 0; c < N; ++c)
        for (int64_t j = L; j < Lp; ++j) enckT[c * Lp + j] = 0.0f;
      for (int64_t j = 0; j < L; ++j) {
        ple(in.zk[g * L + j], N, enck + j * N);
        for (int64_t c = 0; c < N; ++c) enckT[c * Lp + j] = enck[j * N + c];
      }
      for (int64_t i = 0; i < T; ++i) {
        float* pr = proj + i * N;
        if constexpr (NC == 16 && Vec) {                 // summed in registers
          F16 acc = zero16();
          for (int64_t a = 0; a < 16; ++a) fma16(acc, encq[i * 16 + a], W + a * 16);
          fma16(acc, 1.0f, uu);
          store16(pr, acc);
        } else {
          for (int64_t c = 0; c < N; ++c) pr[c] = 0.0f;
          for (int64_t a = 0; a < N; ++a) {
            const float e = encq[i * N + a];
#pragma omp simd
            for (int64_t c = 0; c < N; ++c) pr[c] += e * W[a * N + c];
          }
          for (int64_t c = 0; c < N; ++c) pr[c] += uu[c];
        }
      }
    }
    if (noise) gumbel_stream_cpu(in.seed, g, T * L, u.noise.data());
    for (int64_t i = 0; i < T; ++i) {
      const int64_t last = i + P;                       // keys j <= i + P (< L)
      float* pre_i = pre + i * Lp;
      float* p_i = p + i * Lp;
      const float* rr = rrev + (L - 1 - last);
      const float* ok = u.valid.data() + i * Lp;
      const float* bias = u.bias.data() + i * Lp;
      if (cr != 0.0f) {
        const float* pr = proj + i * N;
        if constexpr (!Vec) {
          float* row = u.row.data();
          for (int64_t j = 0; j < Lp; ++j) row[j] = 0.0f;
          for (int64_t c = 0; c < N; ++c) {
            const float q = pr[c];
            const float* ek = enckT + c * Lp;
#pragma omp simd
            for (int64_t j = 0; j < Lp; ++j) row[j] += q * ek[j];
          }
#pragma omp simd
          for (int64_t j = 0; j < Lp; ++j) pre_i[j] = ((row[j] * cr + rr[j]) + abp[j]) * ok[j];
        } else for (int64_t j0 = 0; j0 < Lp; j0 += 16) {    // 16 keys at a time, summed over the bins in registers
          F16 acc = zero16();
          for (int64_t c = 0; c < N; ++c) fma16(acc, pr[c], enckT + c * Lp + j0);
          store16(pre_i + j0, acc);
#pragma omp simd
          for (int64_t l = j0; l < j0 + 16; ++l) pre_i[l] = ((pre_i[l] * cr + rr[l]) + abp[l]) * ok[l];
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < Lp; ++j) pre_i[j] = ((0.0f + rr[j]) + abp[j]) * ok[j];
      }
      const float* nz = u.noise.data() + i * L;        // zeros without noise; past L only where masked
      float m = ninf;
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j < Lp; ++j) {
        const float z = (pre_i[j] * sc + nz[j]) + bias[j];
        p_i[j] = z;
        m = std::max(m, z);
      }
      if (hard) {                                       // the first maximum of z, as torch.argmax
        int32_t best = 0;
        while (p_i[best] != m && best < last) ++best;
        u.arg[h * T + i] = best;
      }
      // softmax(z / tau): max(z / tau) = max(z) / tau for tau > 0
      const float mx = m * itau;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < Lp; ++j) {
        const float e = exp_neg(p_i[j] * itau - mx) * ok[j];
        p_i[j] = e;
        sum += e;
      }
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int64_t j = 0; j < Lp; ++j) p_i[j] *= inv;
    }
  }
}

template <int NC, bool Vec>
WTC_INLINE void forward_unit(const DtRouteShapes& s, const DtRouteInputs& in, int64_t rb, Unit& u, float* out,
                             float* o_rows, float* ent) {
  const int64_t H = s.H, T = s.T, Lp = u.Lp;
  recompute<NC, Vec>(s, in, rb / s.B, rb % s.B, u);
  if (ent != nullptr) {   // entropy of the noise-free softmax(scale * pre / tau): H = m + log S - sum e x / S
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int64_t h = 0; h < H; ++h) {
      const float f = in.scale[(rb / s.B) * H + h] * in.inv_tau;
      for (int64_t i = 0; i < T; ++i) {
        const float* pre_i = u.pre + (h * T + i) * Lp;
        const float* bias = u.bias.data() + i * Lp;
        const float* ok = u.valid.data() + i * Lp;
        float m = ninf;
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < Lp; ++j) m = std::max(m, pre_i[j] * f + bias[j]);
        float S = 0.0f, Sx = 0.0f;
#pragma omp simd reduction(+ : S, Sx)
        for (int64_t j = 0; j < Lp; ++j) {
          const float x = pre_i[j] * f * ok[j];
          const float e = exp_neg(x - m) * ok[j];
          S += e;
          Sx += e * x;
        }
        ent[(rb * H + h) * T + i] = m + std::log(S) - Sx / S;
      }
    }
  }
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = rb * H + h;
    const float* valp = u.valp + h * Lp;
    for (int64_t i = 0; i < T; ++i) {
      if (in.hard) {
        out[g * T + i] = valp[u.arg[h * T + i]];
      } else {
        const float* p_i = u.p + (h * T + i) * Lp;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < Lp; ++j) acc += p_i[j] * valp[j];
        out[g * T + i] = acc;
      }
    }
    if (o_rows == nullptr) continue;
    for (int64_t h2 = 0; h2 < H; ++h2) {
      float* o = o_rows + (g * H + h2) * T;
      for (int64_t i = 0; i < T; ++i) {
        float acc = 0.0f;
        if (h2 > h) {
          const float* a = u.p + (h * T + i) * Lp;
          const float* c = u.p + (h2 * T + i) * Lp;
#pragma omp simd reduction(+ : acc)
          for (int64_t j = 0; j < Lp; ++j) acc += a[j] * c[j];
        }
        o[i] = acc;
      }
    }
  }
}

struct Back {
  std::vector<float> dp, ds, dproj, denck, dcode, drr, dabsp, dvalp, WT;
  explicit Back(const DtRouteShapes& s, int64_t Lp)
      : dp(Lp), ds(Lp), dproj(s.T * s.N), denck(s.L * s.N), dcode(s.N), drr(s.H * (s.L + Lp)),
        dabsp(s.H * Lp), dvalp(Lp), WT(s.N * s.N) {}
};

// One sequence b of replica r: dval, dzq, dzk written; the replica's parameter gradients accumulated
// (drel reversed in bk.drr, dabs in bk.dabsp).
template <int NC, bool Vec>
WTC_INLINE void backward_unit(const DtRouteShapes& s, const DtRouteInputs& in, const float* dout,
                              const float* cgrad, bool score_grads, const DtRouteGrads& gr, int64_t r,
                              int64_t b, Unit& u, Back& bk, bool restored) {
  const int64_t B = s.B, H = s.H, T = s.T, L = s.L, N = NC > 0 ? NC : s.N, P = s.pad, Lp = u.Lp;
  const float cr = in.content[r], itau = in.inv_tau;
  const bool hard = in.hard;
  if (!restored) recompute<NC, Vec>(s, in, r, b, u);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = (r * B + b) * H + h, rh = r * H + h;
    const float* valp = u.valp + h * Lp;
    const float* dout_g = dout + g * T;
    const float* p = u.p + h * T * Lp;
    float* dvalp = bk.dvalp.data();
    for (int64_t j = 0; j < Lp; ++j) dvalp[j] = 0.0f;
    for (int64_t i = 0; i < T; ++i) {
      if (hard) {
        dvalp[u.arg[h * T + i]] += dout_g[i];
      } else {
        const float d = dout_g[i];
        const float* p_i = p + i * Lp;
#pragma omp simd
        for (int64_t j = 0; j < Lp; ++j) dvalp[j] += p_i[j] * d;
      }
    }
    for (int64_t j = 0; j < L; ++j) gr.dval[g * L + j] = dvalp[j];
    if (!score_grads) continue;
    const float sc = in.scale[rh];
    const float* pre = u.pre + h * T * Lp;
    const float* enck = u.enck + h * L * N;
    const float* proj = u.proj + h * T * N;
    float* drr = bk.drr.data() + h * (L + Lp);
    float* dabsp = bk.dabsp.data() + h * Lp;
    float* dp = bk.dp.data();
    float* ds = bk.ds.data();
    float dscale = 0.0f;
    if (cr != 0.0f) {
      std::fill(bk.dproj.begin(), bk.dproj.end(), 0.0f);
      std::fill(bk.denck.begin(), bk.denck.end(), 0.0f);
    }
    for (int64_t i = 0; i < T; ++i) {
      const int64_t last = i + P, n = last + 1;
      const float* p_i = p + i * Lp;
      const float* pre_i = pre + i * Lp;
      const float d = dout_g[i];
#pragma omp simd
      for (int64_t j = 0; j < Lp; ++j) dp[j] = d * valp[j];
      if (cgrad != nullptr) {
        for (int64_t h2 = 0; h2 < H; ++h2) {
          if (h2 == h) continue;
          const float c = cgrad[(g * H + h2) * T + i];
          const float* p2 = u.p + (h2 * T + i) * Lp;
#pragma omp simd
          for (int64_t j = 0; j < Lp; ++j) dp[j] += c * p2[j];
        }
      }
      float D = 0.0f;
#pragma omp simd reduction(+ : D)
      for (int64_t j = 0; j < Lp; ++j) D += p_i[j] * dp[j];
      float* dr = drr + (L - 1 - last);
#pragma omp simd reduction(+ : dscale)
      for (int64_t j = 0; j < Lp; ++j) {
        const float dz = p_i[j] * (dp[j] - D) * itau;    // d loss / d z; 0 where masked (p = 0)
        dscale += dz * pre_i[j];
        const float dpre = dz * sc;
        ds[j] = dpre;
        dabsp[j] += dpre;
        dr[j] += dpre;
      }
      if (cr != 0.0f) {
        float* dpr = bk.dproj.data() + i * N;
        const float* pr = proj + i * N;
        if constexpr (NC == 16 && Vec) {   // this query's d proj summed over its keys in registers
          F16 acc = load16(dpr);
          for (int64_t j = 0; j < n; ++j) {
            const float dsc = ds[j] * cr;
            F16 dek = load16(bk.denck.data() + j * 16);
            fma16(acc, dsc, enck + j * 16);
            fma16(dek, dsc, pr);
            store16(bk.denck.data() + j * 16, dek);
          }
          store16(dpr, acc);
        } else {
          for (int64_t j = 0; j < n; ++j) {
            const float dsc = ds[j] * cr;
            const float* ek = enck + j * N;
            float* dek = bk.denck.data() + j * N;
#pragma omp simd
            for (int64_t c = 0; c < N; ++c) {
              dpr[c] += dsc * ek[c];
              dek[c] += dsc * pr[c];
            }
          }
        }
      }
    }
    gr.dscale[rh] += dscale;
    if (cr != 0.0f) {
      float* dW = gr.dW + rh * N * N;
      float* du = gr.du + rh * N;
      const float* W = in.W + rh * N * N;
      const float* encq = u.encq + h * T * N;
      float* dcode = bk.dcode.data();
      float* WT = bk.WT.data();                           // W transposed: d code = W dproj without reductions
      for (int64_t a = 0; a < N; ++a)
        for (int64_t c = 0; c < N; ++c) WT[c * N + a] = W[a * N + c];
      for (int64_t i = 0; i < T; ++i) {
        const float* dpr = bk.dproj.data() + i * N;
        for (int64_t a = 0; a < N; ++a) {
          const float e = encq[i * N + a];
#pragma omp simd
          for (int64_t c = 0; c < N; ++c) dW[a * N + c] += e * dpr[c];
          dcode[a] = 0.0f;
        }
        if constexpr (NC == 16 && Vec) {   // summed in registers
          F16 acc = zero16();
          for (int64_t c = 0; c < 16; ++c) fma16(acc, dpr[c], WT + c * 16);
          store16(dcode, acc);
        } else {
          for (int64_t c = 0; c < N; ++c) {
            const float d = dpr[c];
#pragma omp simd
            for (int64_t a = 0; a < N; ++a) dcode[a] += d * WT[c * N + a];
          }
        }
#pragma omp simd
        for (int64_t c = 0; c < N; ++c) du[c] += dpr[c];
        gr.dzq[g * T + i] = ple_grad(in.zq[g * T + i], N, dcode);
      }
      for (int64_t j = 0; j < L; ++j) gr.dzk[g * L + j] = ple_grad(in.zk[g * L + j], N, bk.denck.data() + j * N);
    } else {
      for (int64_t i = 0; i < T; ++i) gr.dzq[g * T + i] = 0.0f;
      for (int64_t j = 0; j < L; ++j) gr.dzk[g * L + j] = 0.0f;
    }
  }
}

template <bool Vec>
WTC_INLINE void forward_seq_impl(const DtRouteShapes& s, const DtRouteInputs& in, int64_t rb, Unit& u, float* out,
                                 float* o_rows, float* ent) {
  if (s.N == 16) forward_unit<16, Vec>(s, in, rb, u, out, o_rows, ent);
  else forward_unit<0, Vec>(s, in, rb, u, out, o_rows, ent);
}

template <bool Vec>
WTC_INLINE void backward_seq_impl(const DtRouteShapes& s, const DtRouteInputs& in, const float* dout,
                                  const float* cgrad, bool score_grads, const DtRouteGrads& gr, int64_t r, int64_t b,
                                  Unit& u, Back& bk, bool restored) {
  if (s.N == 16) backward_unit<16, Vec>(s, in, dout, cgrad, score_grads, gr, r, b, u, bk, restored);
  else backward_unit<0, Vec>(s, in, dout, cgrad, score_grads, gr, r, b, u, bk, restored);
}

// ---- position-only replicas (content = 0), 16 sequences at a time
// Their scores pre(i, j) = rel[i + P - j] + abs[j] do not depend on the sequence, only the noise
// does: the loops run over keys with the 16 sequences of a block as the vector lanes, so the
// softmax's max and sums are lane-wise (no horizontal reductions, no masked key padding).
constexpr int64_t LANES = 16;

// What the backward reads of a block (p, pre, valT, arg: lanes_floats) lives in one block, bound as
// the Unit's is (own storage, or the block's region of the kept buffer).
inline int64_t lanes_floats(const DtRouteShapes& s) {
  const int64_t H = s.H, T = s.T, L = s.L;
  return H * T * L * LANES + H * T * L + H * L * LANES + H * T * LANES;
}

struct Lanes {
  std::vector<float> noise, nzT, z, dp, acc_abs, acc_rel, acc_scale, dvalT;
  std::vector<float> own;
  float *p, *pre, *valT;
  int32_t* arg;
  int64_t HTLL, HTL, HLL;      // the block's sizes: H T L LANES, H T L, H L LANES
  explicit Lanes(const DtRouteShapes& s)
      : noise(LANES * s.T * s.L), nzT(s.T * s.L * LANES), z(s.L * LANES), dp(s.L * LANES),
        acc_abs(s.H * s.L * LANES), acc_rel(s.H * s.L * LANES), acc_scale(s.H * LANES), dvalT(s.L * LANES),
        own(lanes_floats(s)), HTLL(s.H * s.T * s.L * LANES), HTL(s.H * s.T * s.L), HLL(s.H * s.L * LANES) {
    bind(own.data());
  }
  void bind(float* base) {
    p = base;
    pre = p + HTLL;
    valT = pre + HTL;
    arg = reinterpret_cast<int32_t*>(valT + HLL);
  }
};

// Probabilities p[h][i][j][lane] (and argmax keys) of sequences b0 .. b0 + nb of replica r; lanes
// past nb hold copies of lane 0's inputs and are never written out.
WTC_INLINE void lanes_recompute(const DtRouteShapes& s, const DtRouteInputs& in, int64_t r, int64_t b0, int64_t nb,
                                Lanes& w) {
  const int64_t H = s.H, T = s.T, L = s.L, P = s.pad, TL = T * L;
  const float itau = in.inv_tau;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t h = 0; h < H; ++h) {
    const int64_t rh = r * H + h;
    const float sc = in.scale[rh];
    float* pre = w.pre + h * TL;
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j <= i + P; ++j) pre[i * L + j] = (0.0f + in.rel[rh * L + i + P - j]) + in.abs_[rh * L + j];
    for (int64_t l = 0; l < LANES; ++l) {
      const int64_t g = (r * s.B + b0 + (l < nb ? l : 0)) * H + h;
      for (int64_t j = 0; j < L; ++j) w.valT[(h * L + j) * LANES + l] = in.val[g * L + j];
    }
    if (in.noise) {
      for (int64_t l = 0; l < LANES; ++l)
        gumbel_stream_cpu(in.seed, (r * s.B + b0 + (l < nb ? l : 0)) * H + h, TL, w.noise.data() + l * TL);
      for (int64_t c = 0; c < TL; ++c)
        for (int64_t l = 0; l < LANES; ++l) w.nzT[c * LANES + l] = w.noise[l * TL + c];
    }
    for (int64_t i = 0; i < T; ++i) {
      const int64_t n = i + P + 1;
      float m[LANES], sum[LANES];
      int32_t best[LANES];
      for (int64_t l = 0; l < LANES; ++l) { m[l] = ninf; sum[l] = 0.0f; best[l] = 0; }
      for (int64_t j = 0; j < n; ++j) {
        const float base = pre[i * L + j] * sc;
        const float* nz = w.nzT.data() + (i * L + j) * LANES;
        float* zj = w.z.data() + j * LANES;
#pragma omp simd
        for (int64_t l = 0; l < LANES; ++l) {
          const float z = base + (in.noise ? nz[l] : 0.0f);
          zj[l] = z;
          best[l] = z > m[l] ? static_cast<int32_t>(j) : best[l];   // strict: the first maximum
          m[l] = std::max(m[l], z);
        }
      }
      float* p = w.p + (h * T + i) * L * LANES;
      for (int64_t j = 0; j < n; ++j) {
        const float* zj = w.z.data() + j * LANES;
        float* pj = p + j * LANES;
#pragma omp simd
        for (int64_t l = 0; l < LANES; ++l) {
          const float e = exp_neg(zj[l] * itau - m[l] * itau);
          pj[l] = e;
          sum[l] += e;
        }
      }
      float inv[LANES];
      for (int64_t l = 0; l < LANES; ++l) inv[l] = 1.0f / sum[l];
      for (int64_t j = 0; j < n; ++j) {
        float* pj = p + j * LANES;
#pragma omp simd
        for (int64_t l = 0; l < LANES; ++l) pj[l] *= inv[l];
      }
      for (int64_t j = n; j < L; ++j)
        for (int64_t l = 0; l < LANES; ++l) p[j * LANES + l] = 0.0f;
      for (int64_t l = 0; l < LANES; ++l) w.arg[(h * T + i) * LANES + l] = best[l];
    }
  }
}

WTC_INLINE void lanes_forward_impl(const DtRouteShapes& s, const DtRouteInputs& in, int64_t r, int64_t b0, int64_t nb,
                                   Lanes& w, float* out, float* o_rows, float* ent) {
  const int64_t H = s.H, T = s.T, L = s.L, P = s.pad;
  lanes_recompute(s, in, r, b0, nb, w);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < T; ++i) {
      const int64_t n = i + P + 1;
      const float* p = w.p + (h * T + i) * L * LANES;
      const float* valT = w.valT + h * L * LANES;
      float acc[LANES];
      if (in.hard) {
        for (int64_t l = 0; l < LANES; ++l) acc[l] = valT[w.arg[(h * T + i) * LANES + l] * LANES + l];
      } else {
        for (int64_t l = 0; l < LANES; ++l) acc[l] = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
#pragma omp simd
          for (int64_t l = 0; l < LANES; ++l) acc[l] += p[j * LANES + l] * valT[j * LANES + l];
        }
      }
      for (int64_t l = 0; l < nb; ++l) out[((r * s.B + b0 + l) * H + h) * T + i] = acc[l];
      if (o_rows != nullptr) {
        for (int64_t h2 = 0; h2 < H; ++h2) {
          float o[LANES] = {};
          if (h2 > h) {
            const float* p2 = w.p + (h2 * T + i) * L * LANES;
            for (int64_t j = 0; j < n; ++j) {
#pragma omp simd
              for (int64_t l = 0; l < LANES; ++l) o[l] += p[j * LANES + l] * p2[j * LANES + l];
            }
          }
          for (int64_t l = 0; l < nb; ++l) o_rows[(((r * s.B + b0 + l) * H + h) * H + h2) * T + i] = o[l];
        }
      }
      if (ent != nullptr) {   // noise-free: the same for every sequence of the replica
        const float f = in.scale[r * H + h] * in.inv_tau;
        const float* pre = w.pre + (h * T + i) * L;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) m = std::max(m, pre[j] * f);
        float S = 0.0f, Sx = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          const float x = pre[j] * f;
          const float e = exp_neg(x - m);
          S += e;
          Sx += e * x;
        }
        const float hval = m + std::log(S) - Sx / S;
        for (int64_t l = 0; l < nb; ++l) ent[((r * s.B + b0 + l) * H + h) * T + i] = hval;
      }
    }
  }
}

// One block of sequences of a position-only replica: dval, dzq = dzk = 0 written; the replica's
// abs / rel / scale gradients accumulated per lane in w (summed over lanes by the caller).
WTC_INLINE void lanes_backward_impl(const DtRouteShapes& s, const DtRouteInputs& in, const float* dout,
                                    const float* cgrad, bool score_grads, const DtRouteGrads& gr, int64_t r, int64_t b0,
                                    int64_t nb, Lanes& w, bool restored) {
  const int64_t H = s.H, T = s.T, L = s.L, P = s.pad;
  const float itau = in.inv_tau;
  if (!restored) lanes_recompute(s, in, r, b0, nb, w);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t rh = r * H + h;
    const float sc = in.scale[rh];
    const float* valT = w.valT + h * L * LANES;
    float* dvalT = w.dvalT.data();
    std::fill(w.dvalT.begin(), w.dvalT.end(), 0.0f);
    float* acc_abs = w.acc_abs.data() + h * L * LANES;
    float* acc_rel = w.acc_rel.data() + h * L * LANES;
    float* acc_scale = w.acc_scale.data() + h * LANES;
    for (int64_t i = 0; i < T; ++i) {
      const int64_t n = i + P + 1;
      const float* p = w.p + (h * T + i) * L * LANES;
      const float* pre = w.pre + (h * T + i) * L;
      float d[LANES];
      for (int64_t l = 0; l < LANES; ++l) d[l] = l < nb ? dout[((r * s.B + b0 + l) * H + h) * T + i] : 0.0f;
      if (in.hard) {
        for (int64_t l = 0; l < LANES; ++l) dvalT[w.arg[(h * T + i) * LANES + l] * LANES + l] += d[l];
      } else {
        for (int64_t j = 0; j < n; ++j) {
#pragma omp simd
          for (int64_t l = 0; l < LANES; ++l) dvalT[j * LANES + l] += p[j * LANES + l] * d[l];
        }
      }
      if (!score_grads) continue;
      float* dp = w.dp.data();
      for (int64_t j = 0; j < n; ++j) {
#pragma omp simd
        for (int64_t l = 0; l < LANES; ++l) dp[j * LANES + l] = d[l] * valT[j * LANES + l];
      }
      if (cgrad != nullptr) {
        for (int64_t h2 = 0; h2 < H; ++h2) {
          if (h2 == h) continue;
          float c[LANES];
          for (int64_t l = 0; l < LANES; ++l)
            c[l] = l < nb ? cgrad[(((r * s.B + b0 + l) * H + h) * H + h2) * T + i] : 0.0f;
          const float* p2 = w.p + (h2 * T + i) * L * LANES;
          for (int64_t j = 0; j < n; ++j) {
#pragma omp simd
            for (int64_t l = 0; l < LANES; ++l) dp[j * LANES + l] += c[l] * p2[j * LANES + l];
          }
        }
      }
      float D[LANES] = {};
      for (int64_t j = 0; j < n; ++j) {
#pragma omp simd
        for (int64_t l = 0; l < LANES; ++l) D[l] += p[j * LANES + l] * dp[j * LANES + l];
      }
      for (int64_t j = 0; j < n; ++j) {
        const float pr = pre[j];
        float* aa = acc_abs + j * LANES;
        float* ar = acc_rel + (i + P - j) * LANES;
#pragma omp simd
        for (int64_t l = 0; l < LANES; ++l) {
          const float dz = p[j * LANES + l] * (dp[j * LANES + l] - D[l]) * itau;   // 0 on padding lanes (d = c = 0)
          acc_scale[l] += dz * pr;
          const float dpre = dz * sc;
          aa[l] += dpre;
          ar[l] += dpre;
        }
      }
    }
    for (int64_t l = 0; l < nb; ++l) {
      const int64_t g = (r * s.B + b0 + l) * H + h;
      for (int64_t j = 0; j < L; ++j) gr.dval[g * L + j] = dvalT[j * LANES + l];
      if (score_grads) {
        for (int64_t i = 0; i < T; ++i) gr.dzq[g * T + i] = 0.0f;
        for (int64_t j = 0; j < L; ++j) gr.dzk[g * L + j] = 0.0f;
      }
    }
  }
}

// ---- what a forward keeps for its backward (dt_route_saved_floats): per replica, one Unit block per
// sequence (content replicas) or one Lanes block per LANES sequences (position-only replicas).
struct SavedLayout {
  int64_t unit, block;
  std::vector<int64_t> start;
  int64_t total = 0;
  SavedLayout(const DtRouteShapes& s, const float* content)
      : unit(unit_floats(s)), block(lanes_floats(s)), start(s.R) {
    const int64_t blocks = (s.B + LANES - 1) / LANES;
    for (int64_t r = 0; r < s.R; ++r) {
      start[r] = total;
      total += content[r] == 0.0f ? blocks * block : s.B * unit;
    }
  }
};

// ---- one copy of the entry points per instruction set (dt_isa.h), called through RouteFns
#define WTC_FWD_SEQ_ARGS const DtRouteShapes &s, const DtRouteInputs &in, int64_t rb, Unit &u, float *out, \
                         float *o_rows, float *ent
#define WTC_BWD_SEQ_ARGS const DtRouteShapes &s, const DtRouteInputs &in, const float *dout, const float *cgrad, \
                         bool score_grads, const DtRouteGrads &gr, int64_t r, int64_t b, Unit &u, Back &bk, \
                         bool restored
#define WTC_LANES_FWD_ARGS const DtRouteShapes &s, const DtRouteInputs &in, int64_t r, int64_t b0, int64_t nb, \
                           Lanes &w, float *out, float *o_rows, float *ent
#define WTC_LANES_BWD_ARGS const DtRouteShapes &s, const DtRouteInputs &in, const float *dout, const float *cgrad, \
                           bool score_grads, const DtRouteGrads &gr, int64_t r, int64_t b0, int64_t nb, Lanes &w, \
                           bool restored

struct RouteFns {
  void (*forward_seq)(WTC_FWD_SEQ_ARGS);
  void (*backward_seq)(WTC_BWD_SEQ_ARGS);
  void (*lanes_forward)(WTC_LANES_FWD_ARGS);
  void (*lanes_backward)(WTC_LANES_BWD_ARGS);
};

#define WTC_ROUTE_COPY(ISA, TARGET, VEC)                                                                         \
  TARGET void forward_seq_##ISA(WTC_FWD_SEQ_ARGS) { forward_seq_impl<VEC>(s, in, rb, u, out, o_rows, ent); }     \
  TARGET void backward_seq_##ISA(WTC_BWD_SEQ_ARGS) {                                                             \
    backward_seq_impl<VEC>(s, in, dout, cgrad, score_grads, gr, r, b, u, bk, restored);                          \
  }                                                                                                              \
  TARGET void lanes_forward_##ISA(WTC_LANES_FWD_ARGS) { lanes_forward_impl(s, in, r, b0, nb, w, out, o_rows, ent); } \
  TARGET void lanes_backward_##ISA(WTC_LANES_BWD_ARGS) {                                                         \
    lanes_backward_impl(s, in, dout, cgrad, score_grads, gr, r, b0, nb, w, restored);                            \
  }                                                                                                              \
  constexpr RouteFns route_##ISA{forward_seq_##ISA, backward_seq_##ISA, lanes_forward_##ISA, lanes_backward_##ISA};

// the portable copy sums through memory (plain loops): SSE2 lowered the 8-float vectors' broadcasts
// through the stack, 2.7x slower (measured)
WTC_ROUTE_COPY(portable, , false)
#ifdef WTC_DT_DISPATCH
WTC_ROUTE_COPY(avx2, WTC_DT_TARGET("arch=x86-64-v3"), true)
WTC_ROUTE_COPY(avx512, WTC_DT_TARGET("arch=x86-64-v4"), true)
#endif

const RouteFns& route_fns() {
#ifdef WTC_DT_DISPATCH
  switch (dt_isa()) {
    case kDtIsaAvx512: return route_avx512;
    case kDtIsaAvx2: return route_avx2;
    default: break;
  }
#endif
  return route_portable;
}

}  // namespace

int64_t dt_route_saved_floats(const DtRouteShapes& s, const float* content) {
  return SavedLayout(s, content).total;
}

void dt_route_forward(const DtRouteShapes& s, const DtRouteInputs& in, float* out, float* o_rows, float* ent,
                      float* saved, int threads) {
  const int64_t blocks = (s.B + LANES - 1) / LANES;
  const RouteFns& fns = route_fns();
  const SavedLayout lay(s, in.content);
#pragma omp parallel num_threads(std::max(1, threads))
  {
    FlushDenormals ftz;
    Unit u(s);
    Lanes w(s);
#pragma omp for schedule(static)
    for (int64_t rk = 0; rk < s.R * blocks; ++rk) {   // (replica, block of 16 sequences)
      const int64_t r = rk / blocks, b0 = (rk % blocks) * LANES, nb = std::min(LANES, s.B - b0);
      if (in.content[r] == 0.0f) {
        w.bind(saved != nullptr ? saved + lay.start[r] + (b0 / LANES) * lay.block : w.own.data());
        fns.lanes_forward(s, in, r, b0, nb, w, out, o_rows, ent);
      } else {
        for (int64_t b = b0; b < b0 + nb; ++b) {
          u.bind(saved != nullptr ? saved + lay.start[r] + b * lay.unit : u.own.data());
          fns.forward_seq(s, in, r * s.B + b, u, out, o_rows, ent);
        }
      }
    }
  }
}

void dt_route_backward(const DtRouteShapes& s, const DtRouteInputs& in, const float* dout, const float* cgrad,
                       bool score_grads, const DtRouteGrads& gr, const float* saved, int threads) {
  const int64_t H = s.H, L = s.L, N = s.N;
  const RouteFns& fns = route_fns();
  const SavedLayout lay(s, in.content);
  const bool restored = saved != nullptr;
#pragma omp parallel num_threads(std::max(1, threads))
  {
    FlushDenormals ftz;
    Unit u(s);
    Back bk(s, u.Lp);
    Lanes w(s);
    const int64_t Lp = u.Lp;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < s.R; ++r) {
      if (score_grads) {
        std::fill(gr.dW + r * H * N * N, gr.dW + (r + 1) * H * N * N, 0.0f);
        std::fill(gr.du + r * H * N, gr.du + (r + 1) * H * N, 0.0f);
        std::fill(gr.dscale + r * H, gr.dscale + (r + 1) * H, 0.0f);
        std::fill(bk.drr.begin(), bk.drr.end(), 0.0f);
        std::fill(bk.dabsp.begin(), bk.dabsp.end(), 0.0f);
      }
      if (in.content[r] == 0.0f) {   // position-only: 16 sequences at a time, per-lane sums, then lanes summed
        std::fill(w.acc_abs.begin(), w.acc_abs.end(), 0.0f);
        std::fill(w.acc_rel.begin(), w.acc_rel.end(), 0.0f);
        std::fill(w.acc_scale.begin(), w.acc_scale.end(), 0.0f);
        for (int64_t b0 = 0; b0 < s.B; b0 += LANES) {
          if (restored) w.bind(const_cast<float*>(saved) + lay.start[r] + (b0 / LANES) * lay.block);
          fns.lanes_backward(s, in, dout, cgrad, score_grads, gr, r, b0, std::min(LANES, s.B - b0), w, restored);
        }
        if (score_grads)
          for (int64_t h = 0; h < H; ++h) {
            float sc = 0.0f;
            for (int64_t l = 0; l < LANES; ++l) sc += w.acc_scale[h * LANES + l];
            gr.dscale[r * H + h] = sc;
            for (int64_t k = 0; k < L; ++k) {
              float a = 0.0f, d = 0.0f;
              for (int64_t l = 0; l < LANES; ++l) {
                a += w.acc_abs[(h * L + k) * LANES + l];
                d += w.acc_rel[(h * L + k) * LANES + l];
              }
              gr.dabs[(r * H + h) * L + k] = a;
              gr.drel[(r * H + h) * L + k] = d;
            }
          }
        continue;
      }
      for (int64_t b = 0; b < s.B; ++b) {
        if (restored) u.bind(const_cast<float*>(saved) + lay.start[r] + b * lay.unit);   // read only
        fns.backward_seq(s, in, dout, cgrad, score_grads, gr, r, b, u, bk, restored);
      }
      if (score_grads)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t k = 0; k < L; ++k) {
            gr.drel[(r * H + h) * L + k] = bk.drr[h * (L + Lp) + L - 1 - k];
            gr.dabs[(r * H + h) * L + k] = bk.dabsp[h * Lp + k];
          }
    }
  }
}

}  // namespace wtc
