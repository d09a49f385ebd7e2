// The Discrete Transformer's sub-MLP bank on the CPU, forward and backward: the twin of
// wtc/kernels/submlps.py (Triton) and of wtc.dt.submlp.SubMLPs.evaluate (torch, the reference).
// Plain pointers and sizes; no Python, no torch.
//
// Sub-MLP m of replica r maps its k inputs x (one row of x (R, n, M, k)) to
//   h1 = act(W1[r, m] x + b1[r, m])                                     (hidden units)
//   h2 = act(W_mid[r, m] h1 + b_mid[r, m])                              (depth 2 only)
//   y  = W2[r, m] . h_last + b2[r, m] + skip[r, m] . x                  -> y (R, n, M)
// act: 0 relu, 1 silu, 2 gelu (erf), 3 tanh, 4 relu on the first hidden / 2 units, silu on the rest.
// Rows are processed in blocks with the loops over rows innermost (they vectorise). Threads split
// (replica, sub-MLP) pairs; each pair's parameter gradients are summed over its rows in order, so
// every result is the same for any thread count.
#pragma once
#include <cstdint>

namespace wtc {

struct DtMlpShapes {
  int64_t R, n, M, k, hidden;
  int depth;        // 1 or 2
  int act;          // see above
};

// T: float (training) or double (the float64 precision pass); instantiated for both in dt_mlp.cpp
template <typename T>
struct DtMlpParamsT {
  const T *W1, *b1, *W2, *b2, *skip;   // (R, M, hidden, k), (R, M, hidden), (R, M, hidden), (R, M), (R, M, k)
  const T *W_mid, *b_mid;              // (R, M, hidden, hidden), (R, M, hidden) or nullptr (depth 1)
};

template <typename T>
void dt_mlp_forward(const DtMlpShapes& s, const T* x, const DtMlpParamsT<T>& p, T* y, int threads);

template <typename T>
struct DtMlpGradsT {
  T *dx, *dW1, *db1, *dW2, *db2, *dskip, *dW_mid, *db_mid;   // like x and the parameters (written)
};
template <typename T>
void dt_mlp_backward(const DtMlpShapes& s, const T* x, const DtMlpParamsT<T>& p, const T* dy,
                     const DtMlpGradsT<T>& g, int threads);

}  // namespace wtc
