// See sr_screen.h. Plain scalar loops: the screen is branchy (bounds, thresholds, sorted inserts)
// and its cost was numba's start-up, not the arithmetic.
#include "sr_screen.h"

#include <limits>

namespace wtc {
namespace {

constexpr double kCollinear = 1e-9;
constexpr double kInf = std::numeric_limits<double>::infinity();

// yy - b' A^-1 b for the unit-diagonal 3x3 Gram block of (i, j, q) by its adjugate; inf when collinear.
double sse3(const double* G, const double* b, double yy, int64_t N, int64_t i, int64_t j, int64_t q) {
  const double a = G[i * N + j], c = G[i * N + q], e = G[j * N + q];
  const double m00 = 1.0 - e * e, m01 = c * e - a, m02 = a * e - c;
  const double m11 = 1.0 - c * c, m12 = a * c - e, m22 = 1.0 - a * a;
  const double det = m00 + a * m01 + c * m02;
  if (det <= kCollinear) return kInf;
  const double x = b[i], y = b[j], z = b[q];
  const double quad = m00 * x * x + m11 * y * y + m22 * z * z + 2.0 * (m01 * x * y + m02 * x * z + m12 * y * z);
  return yy - quad / det;
}

// A triple scored and offered; appended to out when it passes and holds no passing single or pair.
int64_t offer_triple(const double* G, const double* b, double yy, int64_t N, int64_t i, int64_t j, int64_t q,
                     int64_t lb, double sse_pass, const bool* pass1, const bool* PP, ScreenBest best, ScreenOut out,
                     int64_t n_out) {
  const double sse = sse3(G, b, yy, N, i, j, q);
  if (sse == kInf) return n_out;
  screen_offer(best, lb, sse, i, j, q);
  if (sse <= sse_pass && n_out < out.cap &&
      !(pass1[i] || pass1[j] || pass1[q] || PP[i * N + j] || PP[i * N + q] || PP[j * N + q])) {
    out.idx[n_out * 3 + 0] = i;
    out.idx[n_out * 3 + 1] = j;
    out.idx[n_out * 3 + 2] = q;
    out.sse[n_out] = sse;
    ++n_out;
  }
  return n_out;
}

}  // namespace

void screen_offer(ScreenBest best, int64_t lb, double sse, int64_t i, int64_t j, int64_t q) {
  double* row = best.sse + lb * best.nb;
  int64_t* idx = best.idx + lb * best.nb * 3;
  if (sse >= row[best.nb - 1]) return;
  int64_t r = best.nb - 1;
  while (r > 0 && row[r - 1] > sse) {
    row[r] = row[r - 1];
    for (int k = 0; k < 3; ++k) idx[r * 3 + k] = idx[(r - 1) * 3 + k];
    --r;
  }
  row[r] = sse;
  idx[r * 3 + 0] = i;
  idx[r * 3 + 1] = j;
  idx[r * 3 + 2] = q;
}

int64_t screen_pairs(const double* G, const double* b, double yy, const int64_t* sizes, int64_t N, double sse_pass,
                     int64_t max_lb, const bool* pass1, ScreenBest best, ScreenOut out, bool* PP, double* top_sse,
                     int64_t* top_idx, int64_t n_top) {
  int64_t n_out = 0;
  for (int64_t i = 0; i < N; ++i) {
    const double bi = b[i];
    for (int64_t j = i + 1; j < N; ++j) {
      const int64_t lb = sizes[i] + sizes[j] + 1;
      if (lb > max_lb) continue;
      const double g = G[i * N + j];
      const double den = 1.0 - g * g;
      if (den <= kCollinear) continue;
      const double bj = b[j];
      const double sse = yy - (bi * bi + bj * bj - 2.0 * bi * bj * g) / den;
      if (sse <= sse_pass) {
        PP[i * N + j] = true;
        PP[j * N + i] = true;
        if (!pass1[i] && !pass1[j] && n_out < out.cap) {
          out.idx[n_out * 2 + 0] = i;
          out.idx[n_out * 2 + 1] = j;
          out.sse[n_out] = sse;
          ++n_out;
        }
      }
      screen_offer(best, lb, sse, i, j, -1);
      if (sse < top_sse[n_top - 1]) {
        int64_t r = n_top - 1;
        while (r > 0 && top_sse[r - 1] > sse) {
          top_sse[r] = top_sse[r - 1];
          top_idx[r * 2 + 0] = top_idx[(r - 1) * 2 + 0];
          top_idx[r * 2 + 1] = top_idx[(r - 1) * 2 + 1];
          --r;
        }
        top_sse[r] = sse;
        top_idx[r * 2 + 0] = i;
        top_idx[r * 2 + 1] = j;
      }
    }
  }
  return n_out;
}

int64_t screen_triples(const double* G, const double* b, double yy, int64_t N, const int64_t* T, int64_t nt,
                       const int64_t* sizes, double sse_pass, int64_t max_lb, const bool* pass1, const bool* PP,
                       ScreenBest best, ScreenOut out, int64_t n_out) {
  for (int64_t a = 0; a < nt; ++a) {
    const int64_t i = T[a];
    for (int64_t c = a + 1; c < nt; ++c) {
      const int64_t j = T[c];
      if (sizes[i] + sizes[j] + 3 > max_lb) continue;
      for (int64_t d = c + 1; d < nt; ++d) {
        const int64_t q = T[d];
        const int64_t lb = sizes[i] + sizes[j] + sizes[q] + 2;
        if (lb > max_lb) continue;
        n_out = offer_triple(G, b, yy, N, i, j, q, lb, sse_pass, pass1, PP, best, out, n_out);
      }
    }
  }
  return n_out;
}

int64_t screen_extend(const double* G, const double* b, double yy, int64_t N, const int64_t* top_idx, int64_t n_top,
                      const bool* inT, const int64_t* sizes, double sse_pass, int64_t max_lb, const bool* pass1,
                      const bool* PP, ScreenBest best, ScreenOut out, int64_t n_out) {
  for (int64_t t = 0; t < n_top; ++t) {
    const int64_t i = top_idx[t * 2 + 0], j = top_idx[t * 2 + 1];
    if (i < 0) continue;
    for (int64_t q = 0; q < N; ++q) {
      if (q == i || q == j || (inT[i] && inT[j] && inT[q])) continue;
      const int64_t lb = sizes[i] + sizes[j] + sizes[q] + 2;
      if (lb > max_lb) continue;
      n_out = offer_triple(G, b, yy, N, i, j, q, lb, sse_pass, pass1, PP, best, out, n_out);
    }
  }
  return n_out;
}

}  // namespace wtc
