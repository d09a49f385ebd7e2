// Piecewise Linear Encoding (Gorishniy et al. 2022), shared by the CPU and CUDA kernels.
//
// bins b_0 < ... < b_n define n components; component t (0-based) is
//   (x - b_t) / (b_{t+1} - b_t) clipped to [0, 1],
// except that component 0 is not floored and component n-1 is not capped, so the
// encoding extrapolates linearly outside [b_0, b_n].
#pragma once

#if defined(__CUDACC__)
#define WTC_HD __host__ __device__ __forceinline__
#else
#define WTC_HD inline
#endif

namespace wtc {

WTC_HD float ple_component(float x, const float* bins, int t, int n) {
  float lo = bins[t], hi = bins[t + 1];
  float c = (x - lo) / (hi - lo);
  if (t > 0 && c < 0.f) c = 0.f;
  if (t < n - 1 && c > 1.f) c = 1.f;
  return c;
}

}  // namespace wtc
