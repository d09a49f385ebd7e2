// Fused pointer-head routing of the Discrete Transformer on the CPU, forward and backward: the
// twin of the Triton kernel wtc/kernels/routing.py (and of the torch reference
// wtc.dt.attention.route_reference). Plain pointers and sizes; no Python, no torch.
//
// Head instance g = (r * B + b) * H + h of replica r, sequence b, head h; rh = r * H + h.
//   pre(i, j) = content[r] * (PLE(zq_i) W[rh] + u[rh]) . PLE(zk_j) + rel[rh, i + P - j] + abs[rh, j]
//   z(i, j)   = scale[rh] * pre(i, j) + gumbel(seed; g, i, j)       for keys j <= i + P, else -inf
//   p(i, .)   = softmax(z(i, .) / tau)
//   soft: out_i = sum_j p(i, j) val_j;  hard: out_i = val[argmax_j z(i, j)] (first maximum)
// PLE on N equal bins of [0, 1]: code_t = clip(N z - t, 0, 1), the first not floored, the last not
// capped. Overlaps O[g, h', i] = sum_j p_h(i, j) p_h'(i, j) for h' > h (soft only).
// The backward reads what the forward kept (dt_route_saved_floats) or, given none, recomputes it.
// Threads: the forward splits (replica, sequence) pairs, the backward replicas (each replica's
// parameter gradients are summed over its sequences in order), so every result is the same for
// any thread count.
#pragma once
#include <cstdint>

namespace wtc {

struct DtRouteShapes {
  int64_t R, B, H, T, L, N;
  int pad;         // L = T + pad
};

struct DtRouteInputs {
  const float *zq, *zk, *val;           // (R, B, H, T), (R, B, H, L), (R, B, H, L)
  const float *W, *u, *rel, *abs_;      // (R, H, N, N), (R, H, N), (R, H, L), (R, H, L)
  const float *scale, *content;         // (R, H), (R,)
  float inv_tau;
  bool hard, noise;
  uint32_t seed;
};

// What a backward needs of its forward (scores, probabilities, argmax keys, PLE codes, projections),
// kept by the forward when given room: the backward then reads it instead of recomputing it. Floats
// for the inputs' shapes and content flags (a sequence of a content replica keeps more than a block
// of 16 sequences of a position-only one).
int64_t dt_route_saved_floats(const DtRouteShapes& s, const float* content);

// out (R, B, H, T); o_rows (R, B, H, H, T) or nullptr (no overlaps); ent (R, B, H, T) or nullptr: the
// entropy (nats) of the noise-free softmax(scale * pre / tau) per query (the training log's statistic);
// saved (dt_route_saved_floats) or nullptr: filled for dt_route_backward.
void dt_route_forward(const DtRouteShapes& s, const DtRouteInputs& in, float* out, float* o_rows, float* ent,
                      float* saved, int threads);

// dout (R, B, H, T); c (R, B, H, H, T): d loss / d O symmetrised (c[h, h'] = c[h', h] = the gradient
// of the overlap of the pair), or nullptr. score_grads: whether gradients reach the scores (soft,
// or hard with straight-through). Gradients are written (not accumulated); with score_grads false
// only dval is written.
struct DtRouteGrads {
  float *dzq, *dzk, *dval;              // like zq, zk, val
  float *dW, *du, *drel, *dabs, *dscale;   // like W, u, rel, abs_, scale
};
// saved: what dt_route_forward kept for the same inputs, or nullptr (recomputed from the inputs).
void dt_route_backward(const DtRouteShapes& s, const DtRouteInputs& in, const float* dout, const float* c,
                       bool score_grads, const DtRouteGrads& g, const float* saved, int threads);

}  // namespace wtc
