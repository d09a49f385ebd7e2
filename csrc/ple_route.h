// CPU kernels behind wtc._C. Plain pointers and sizes; no Python, no torch.
#pragma once
#include <cstdint>

namespace wtc {

// Hard (argmax) routing for G independent heads over N sequences.
// Query i of a sequence sits at key position i + q_offset and sees keys j <= i + q_offset.
//   score(i, j) = PLE_q(q_i)^T W PLE_k(k_j) + u . PLE_k(k_j) + rel[i + q_offset - j] + abs_[j]
// Writes the argmax key (first one on ties), the routed value v[j] and the margin between
// the best and second-best score (+inf when only one key is visible).
struct RouteShapes {
  int64_t G, N, Lq, Lk;
  int nq, nk;     // PLE components of query and key
  int n_rel;      // length of rel (offsets 0 .. n_rel-1); larger offsets get rel = 0
  int q_offset;
};
void route_hard_cpu(const RouteShapes& s, const float* q, const float* k, const float* v,
                    const float* q_bins, const float* k_bins, const float* W, const float* u,
                    const float* rel, const float* abs_, int64_t* idx, float* value, float* margin);

}  // namespace wtc
