// wtc._C_cuda: device-pointer entry points. Callers (wtc/_native.py) pass raw pointers of
// contiguous float32/int64 CUDA tensors plus shapes; no torch or DLPack dependency here.
#include <pybind11/pybind11.h>

#include <string>

#include "cuda/route_hard.h"

namespace py = pybind11;

PYBIND11_MODULE(_C_cuda, m) {
  m.doc() = "wtc CUDA kernels (device pointers in, device pointers out)";
  m.def("device_count", &wtc::cuda_device_count, "CUDA devices visible to the runtime (0 if none).");
  m.def(
      "route_hard",
      [](int64_t G, int64_t N, int64_t Lq, int64_t Lk, int nq, int nk, int n_rel, int q_offset,
         uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t q_bins, uintptr_t k_bins, uintptr_t W,
         uintptr_t u, uintptr_t rel, uintptr_t abs_, uintptr_t idx, uintptr_t value,
         uintptr_t margin, uintptr_t stream) {
        wtc::RouteShapes s{G, N, Lq, Lk, nq, nk, n_rel, q_offset};
        int rc;
        {
          py::gil_scoped_release nogil;
          rc = wtc::route_hard_cuda(
              s, reinterpret_cast<const float*>(q), reinterpret_cast<const float*>(k),
              reinterpret_cast<const float*>(v), reinterpret_cast<const float*>(q_bins),
              reinterpret_cast<const float*>(k_bins), reinterpret_cast<const float*>(W),
              reinterpret_cast<const float*>(u), reinterpret_cast<const float*>(rel),
              reinterpret_cast<const float*>(abs_), reinterpret_cast<int64_t*>(idx),
              reinterpret_cast<float*>(value), reinterpret_cast<float*>(margin), stream);
        }
        if (rc != 0) throw std::runtime_error(std::string("route_hard_cuda: ") + wtc::cuda_error_string(rc));
      },
      "Argmax routing on device buffers (see wtc._C.route_hard for the semantics).");
}
