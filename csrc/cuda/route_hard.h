// CUDA launcher behind wtc._C_cuda (host-callable, C++ only in the signature).
#pragma once
#include <cstdint>

#include "ple_route.h"

namespace wtc {

// All pointers are device pointers laid out as in route_hard_cpu. Returns a cudaError_t as int
// (0 = success) so the binding can report it without including CUDA headers.
int route_hard_cuda(const RouteShapes& s, const float* q, const float* k, const float* v,
                    const float* q_bins, const float* k_bins, const float* W, const float* u,
                    const float* rel, const float* abs_, int64_t* idx, float* value,
                    float* margin, uintptr_t stream);
const char* cuda_error_string(int code);
int cuda_device_count();

}  // namespace wtc
