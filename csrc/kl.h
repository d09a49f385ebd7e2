// Per-weight ablation statistics: KL(clean || ablated) per position, the closed form for zeroing
// one unembedding weight, and importance-position selection. CPU, OpenMP; float32 logits in
// (clean log-probs in float64 where a KL near 0 would cancel), float64 accumulation. kl.cpp is compiled with -ffast-math so exp/log vectorise (glibc libmvec); the
// bindings reject non-finite inputs before they get here.
#pragma once
#include <cstdint>
#include <vector>

namespace wtc {

// logp (N, V) clean log-probabilities in float64: a KL near 0 is the difference of two O(1) sums,
// so clean log-probs rounded to float32 (~2e-7 each) would leave a ~1e-7 floor of noise per
// position. logits (A, N, V) ablated logits -> out (A, N) KL(p || q).
void kl_rows_cpu(const double* logp, const float* logits, int64_t A, int64_t N, int64_t V, double* out);

// Rank-1 ablations: logits'[a, n, :] = logits[n, :] + delta[a, n] * direction[a, :], without
// materialising (A, N, V). logp, logits (N, V); delta (A, N); direction (A, V) -> out (A, N).
void kl_rank1_cpu(const double* logp, const float* logits, const float* delta, const float* direction,
                  int64_t A, int64_t N, int64_t V, double* out);

// Zeroing W[v, j] (logit_v = sum_j W[v, j] h_j + b_v) lowers logit v by d = W[v, j] h[n, j], so
// KL_n = p_v d + log(1 - p_v + p_v e^-d). logp (N, V), h (N, D), W (V, D); M pairs (v[m], j[m]).
// per_position: (M, N) float32 or nullptr; total: (M,) float64 (sum over n).
void kl_unembed_cpu(const float* logp, const float* h, const float* W, int64_t N, int64_t V, int64_t D,
                    const int64_t* v, const int64_t* j, int64_t M, float* per_position, double* total);

// For each row of kl (M, N): the smallest set of positions whose KL reaches mass * row total
// (largest KL first, ties to the lower position), in position order. CSR: offsets (M + 1), positions.
void importance_positions_cpu(const float* kl, int64_t M, int64_t N, double mass,
                              std::vector<int64_t>& offsets, std::vector<int32_t>& positions);

}  // namespace wtc
