// Streaming float64 Gramians for ACE (csrc/gramian.cpp): one chunk of activations h (n, D) and
// readout Jacobians J (n, K, D), float32 or float64, folded into running statistics
//   mean (D,), scatter M2 = sum (h - mean)(h - mean)^T (D, D), JJ = sum_i J_i^T J_i (D, D)
// with Chan's merge: the chunk is centred on its own mean while it is packed (float32 is widened
// per block of rows, the chunk is never copied whole), its scatter is added by a blocked symmetric
// rank-k update and the mean shift enters as (n_a n_b / n) d d^T. Only the upper triangle
// (diagonal included) of M2 and JJ is written; the lower one is left as it was (mirror on read).
#pragma once
#include <cstdint>

namespace wtc {

// A strided view of rows x D values: element (r, d) at base[(r / K) * s0 + (r % K) * s1 + d * cs]
// (strides in elements; K = 1 for a 2-D h, K = readout size for a 3-D J seen as n * K rows).
template <class T>
struct RowView {
  const T* base;
  int64_t rows, D, K, s0, s1, cs;
};

// Micro-kernel variants of the rank-k update. kGramianAuto picks the widest the CPU runs.
enum GramianKernel : int { kGramianAuto = 0, kGramianPortable = 1, kGramianAvx2 = 2, kGramianAvx512 = 3 };

// The variant `kernel` resolves to on this CPU (kGramianAuto -> the best one), or -1 when the CPU
// cannot run the one asked for.
int gramian_kernel_resolve(int kernel);
const char* gramian_kernel_name(int resolved);

// Flat index (r * D + d) of the first non-finite value of v, or -1 when all are finite.
template <class T>
int64_t first_nonfinite(const RowView<T>& v);

// C (D, D) row-major, upper triangle += (X - center)^T (X - center) over the rows of X; center (D,)
// or nullptr. Blocked: rows packed a block at a time into float64 panels, OpenMP over upper tiles.
template <class T>
void syrk_upper_cpu(const RowView<T>& X, const double* center, double* C, int kernel);

// What a chunk update found wrong (nothing is written then): flat index (r * D + d) of the first
// non-finite value of h or of J (J seen as J.rows x D), or a finite h whose float64 sum overflows.
struct GramianStatus {
  int64_t bad_h = -1, bad_j = -1;
  bool overflow = false;
  bool ok() const { return bad_h < 0 && bad_j < 0 && !overflow; }
};

// The chunk update: mean and M2 by Chan's merge with n_prev samples already in, JJ += J^T J.
// h.rows samples; J.rows = h.rows * K. Inputs are checked finite first (one pass that also takes
// the chunk mean); on any problem nothing is written and the status says what it was.
template <class TH, class TJ>
GramianStatus gramian_update_cpu(const RowView<TH>& h, const RowView<TJ>& J, int64_t n_prev, double* mean,
                                 double* m2, double* jj, int kernel);

}  // namespace wtc
