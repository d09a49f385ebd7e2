// The linear screen's hot loops (wtc.sr.screen): every pair, the triples of a small index set, and a
// third term on the best pairs, each scored in closed form from the Gram matrix G = U U' (N, N) of
// unit-norm centred columns and b = U y (N,). The same loops, argument for argument, as the numba
// kernels of wtc/sr/numba_eval.py (the reference; tests compare the two bit for bit), without
// numba's import and cache load (about 1 s per fresh process, measured in bench/RESULTS.md).
// Compiled with -ffp-contract=off so no multiply-add is fused where numba's code rounds twice.
#pragma once
#include <cstdint>

namespace wtc {

// The per-complexity best lists: best_sse (L, nb) ascending per row, best_idx (L, nb, 3).
struct ScreenBest {
  double* sse;
  int64_t* idx;
  int64_t nb;
};

// Passing subsets appended to out_idx (cap, width) / out_sse (cap,).
struct ScreenOut {
  int64_t* idx;
  double* sse;
  int64_t cap;
};

// Insert (sse, i, j, q) into row lb of the best lists if it is among the nb lowest (ties: earlier first).
void screen_offer(ScreenBest best, int64_t lb, double sse, int64_t i, int64_t j, int64_t q);

// Every pair i < j with sizes[i] + sizes[j] + 1 <= max_lb. Fills PP (N, N) with the passing pairs,
// the best lists, the passing pairs with no passing single inside (returns their count), and the
// overall top pairs: top_sse (n_top,) ascending, top_idx (n_top, 2).
int64_t screen_pairs(const double* G, const double* b, double yy, const int64_t* sizes, int64_t N, double sse_pass,
                     int64_t max_lb, const bool* pass1, ScreenBest best, ScreenOut out, bool* PP, double* top_sse,
                     int64_t* top_idx, int64_t n_top);

// Every triple of the sorted index set T (nt,); a triple holding a passing single or pair is not
// reported. Returns the new count of passing subsets (n_out on entry).
int64_t screen_triples(const double* G, const double* b, double yy, int64_t N, const int64_t* T, int64_t nt,
                       const int64_t* sizes, double sse_pass, int64_t max_lb, const bool* pass1, const bool* PP,
                       ScreenBest best, ScreenOut out, int64_t n_out);

// Every third term q on the first n_top pairs of top_idx, skipping triples inside T (inT (N,)).
int64_t screen_extend(const double* G, const double* b, double yy, int64_t N, const int64_t* top_idx, int64_t n_top,
                      const bool* inT, const int64_t* sizes, double sse_pass, int64_t max_lb, const bool* pass1,
                      const bool* PP, ScreenBest best, ScreenOut out, int64_t n_out);

}  // namespace wtc
