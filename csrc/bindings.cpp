// wtc._C: CPU kernels (OpenMP). Arrays cross as numpy buffers; shapes are checked here so a
// caller gets a ValueError naming the argument instead of a crash. Messages are built with
// std::to_string, not iostreams: a toolchain that links libstdc++ statically (the GPU machine's
// /opt/gcc) crashed formatting an integer into a string stream inside the module (2026-12-04).
#include <omp.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "dt_isa.h"
#include "dt_mlp.h"
#include "dt_route.h"
#include "gramian.h"
#include "kl.h"
#include "noise.h"
#include "ple_route.h"
#include "sr_screen.h"

namespace py = pybind11;
using farr = py::array_t<float, py::array::c_style | py::array::forcecast>;
using darr = py::array_t<double, py::array::c_style | py::array::forcecast>;

namespace {

void expect_dims(const py::array& a, int nd, const char* name, const char* shape) {
  if (a.ndim() != nd) {
    throw py::value_error(std::string(name) + " must have shape " + shape + ", got " + std::to_string(a.ndim()) +
                          " dimensions");
  }
}

void expect_dim(int64_t got, int64_t want, const char* name, int axis) {
  if (got != want) {
    throw py::value_error(std::string(name) + ": size " + std::to_string(got) + " on axis " + std::to_string(axis) +
                          ", expected " + std::to_string(want));
  }
}

py::tuple route_hard(farr q, farr k, farr v, farr q_bins, farr k_bins, farr W, farr u, farr rel,
                     farr abs_, int q_offset) {
  expect_dims(q, 3, "q", "(G, N, Lq)");
  expect_dims(k, 3, "k", "(G, N, Lk)");
  expect_dims(v, 3, "v", "(G, N, Lk)");
  expect_dims(q_bins, 2, "q_bins", "(G, nq + 1)");
  expect_dims(k_bins, 2, "k_bins", "(G, nk + 1)");
  expect_dims(W, 3, "W", "(G, nq, nk)");
  expect_dims(u, 2, "u", "(G, nk)");
  expect_dims(rel, 2, "rel", "(G, n_rel)");
  expect_dims(abs_, 2, "abs", "(G, Lk)");
  wtc::RouteShapes s{q.shape(0), q.shape(1), q.shape(2), k.shape(2),
                     static_cast<int>(q_bins.shape(1)) - 1, static_cast<int>(k_bins.shape(1)) - 1,
                     static_cast<int>(rel.shape(1)), q_offset};
  if (s.nq < 1 || s.nk < 1) throw py::value_error("q_bins and k_bins need at least 2 edges");
  if (q_offset < 0 || s.Lq + q_offset > s.Lk)
    throw py::value_error("q_offset must place every query on a key position (0 <= q_offset, Lq + q_offset <= Lk)");
  expect_dim(k.shape(0), s.G, "k", 0);
  expect_dim(k.shape(1), s.N, "k", 1);
  for (int ax = 0; ax < 3; ++ax) expect_dim(v.shape(ax), k.shape(ax), "v", ax);
  expect_dim(q_bins.shape(0), s.G, "q_bins", 0);
  expect_dim(k_bins.shape(0), s.G, "k_bins", 0);
  expect_dim(W.shape(0), s.G, "W", 0);
  expect_dim(W.shape(1), s.nq, "W", 1);
  expect_dim(W.shape(2), s.nk, "W", 2);
  expect_dim(u.shape(0), s.G, "u", 0);
  expect_dim(u.shape(1), s.nk, "u", 1);
  expect_dim(rel.shape(0), s.G, "rel", 0);
  expect_dim(abs_.shape(0), s.G, "abs", 0);
  expect_dim(abs_.shape(1), s.Lk, "abs", 1);

  py::array_t<int64_t> idx({s.G, s.N, s.Lq});
  py::array_t<float> value({s.G, s.N, s.Lq}), margin({s.G, s.N, s.Lq});
  {
    py::gil_scoped_release nogil;
    wtc::route_hard_cpu(s, q.data(), k.data(), v.data(), q_bins.data(), k_bins.data(), W.data(),
                        u.data(), rel.data(), abs_.data(), idx.mutable_data(),
                        value.mutable_data(), margin.mutable_data());
  }
  return py::make_tuple(idx, value, margin);
}

template <class T>
void expect_finite(const T* data, int64_t n, const char* name) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(data[i])) {
      throw py::value_error(std::string(name) + " holds a non-finite value at flat index " + std::to_string(i));
    }
}

py::array_t<float> gumbel_hash(int64_t seed, int64_t streams, int64_t T, int64_t L) {
  if (seed < 0 || seed > 0xFFFFFFFFLL) throw py::value_error("gumbel_hash: seed must be in [0, 2^32)");
  if (streams < 0 || T < 0 || L < 0) throw py::value_error("gumbel_hash: streams, T, L must be >= 0");
  if (streams > 0xFFFFFFFFLL || T * L > 0xFFFFFFFFLL)
    throw py::value_error("gumbel_hash: streams and T * L must each fit in 32 bits (the hash counters)");
  py::array_t<float> out({streams, T, L});
  {
    py::gil_scoped_release nogil;
    wtc::gumbel_hash_cpu(static_cast<uint32_t>(seed), streams, T, L, out.mutable_data());
  }
  return out;
}

py::array_t<double> kl_rows(darr logp, farr logits) {
  expect_dims(logp, 2, "logp", "(N, V)");
  expect_dims(logits, 3, "logits", "(A, N, V)");
  const int64_t N = logp.shape(0), V = logp.shape(1), A = logits.shape(0);
  expect_dim(logits.shape(1), N, "logits", 1);
  expect_dim(logits.shape(2), V, "logits", 2);
  expect_finite(logp.data(), logp.size(), "logp");
  expect_finite(logits.data(), logits.size(), "logits");
  py::array_t<double> out({A, N});
  {
    py::gil_scoped_release nogil;
    wtc::kl_rows_cpu(logp.data(), logits.data(), A, N, V, out.mutable_data());
  }
  return out;
}

py::array_t<double> kl_rank1(darr logp, farr logits, farr delta, farr direction) {
  expect_dims(logp, 2, "logp", "(N, V)");
  expect_dims(logits, 2, "logits", "(N, V)");
  expect_dims(delta, 2, "delta", "(A, N)");
  expect_dims(direction, 2, "direction", "(A, V)");
  const int64_t N = logp.shape(0), V = logp.shape(1), A = delta.shape(0);
  expect_dim(logits.shape(0), N, "logits", 0);
  expect_dim(logits.shape(1), V, "logits", 1);
  expect_dim(delta.shape(1), N, "delta", 1);
  expect_dim(direction.shape(0), A, "direction", 0);
  expect_dim(direction.shape(1), V, "direction", 1);
  expect_finite(logp.data(), logp.size(), "logp");
  expect_finite(logits.data(), logits.size(), "logits");
  expect_finite(delta.data(), delta.size(), "delta");
  expect_finite(direction.data(), direction.size(), "direction");
  py::array_t<double> out({A, N});
  {
    py::gil_scoped_release nogil;
    wtc::kl_rank1_cpu(logp.data(), logits.data(), delta.data(), direction.data(), A, N, V, out.mutable_data());
  }
  return out;
}

using iarr = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

py::tuple kl_unembed(farr logp, farr h, farr W, iarr v, iarr j, bool per_position) {
  expect_dims(logp, 2, "logp", "(N, V)");
  expect_dims(h, 2, "h", "(N, D)");
  expect_dims(W, 2, "W", "(V, D)");
  expect_dims(v, 1, "v", "(M,)");
  expect_dims(j, 1, "j", "(M,)");
  const int64_t N = logp.shape(0), V = logp.shape(1), D = h.shape(1), M = v.shape(0);
  expect_dim(h.shape(0), N, "h", 0);
  expect_dim(W.shape(0), V, "W", 0);
  expect_dim(W.shape(1), D, "W", 1);
  expect_dim(j.shape(0), M, "j", 0);
  for (int64_t m = 0; m < M; ++m)
    if (v.data()[m] < 0 || v.data()[m] >= V || j.data()[m] < 0 || j.data()[m] >= D)
      throw py::value_error("pair " + std::to_string(m) + " (v, j) lies outside W (V, D)");
  expect_finite(logp.data(), logp.size(), "logp");
  expect_finite(h.data(), h.size(), "h");
  expect_finite(W.data(), W.size(), "W");
  py::array_t<double> total(M);
  py::array_t<float> per = per_position ? py::array_t<float>({M, N}) : py::array_t<float>(0);
  {
    py::gil_scoped_release nogil;
    wtc::kl_unembed_cpu(logp.data(), h.data(), W.data(), N, V, D, v.data(), j.data(), M,
                        per_position ? per.mutable_data() : nullptr, total.mutable_data());
  }
  return py::make_tuple(total, per);
}

py::tuple importance_positions(farr kl, double mass) {
  expect_dims(kl, 2, "kl", "(M, N)");
  if (!(mass > 0.0 && mass <= 1.0)) throw py::value_error("mass must be in (0, 1]");
  std::vector<int64_t> offsets;
  std::vector<int32_t> positions;
  {
    py::gil_scoped_release nogil;
    wtc::importance_positions_cpu(kl.data(), kl.shape(0), kl.shape(1), mass, offsets, positions);
  }
  py::array_t<int64_t> off(static_cast<py::ssize_t>(offsets.size()));
  std::copy(offsets.begin(), offsets.end(), off.mutable_data());
  py::array_t<int32_t> pos(static_cast<py::ssize_t>(positions.size()));
  std::copy(positions.begin(), positions.end(), pos.mutable_data());
  return py::make_tuple(off, pos);
}

// ---- ACE Gramians (gramian.cpp) --------------------------------------------------------------

// An instruction-set name (the Gramian's kernel= and the DT kernels' WTC_NATIVE_ISA share them).
int isa_id(const std::string& name, const std::string& what) {
  if (name == "auto") return wtc::kGramianAuto;
  if (name == "portable") return wtc::kGramianPortable;
  if (name == "avx2") return wtc::kGramianAvx2;
  if (name == "avx512") return wtc::kGramianAvx512;
  throw py::value_error(what + " must be auto, portable, avx2 or avx512, got '" + name + "'");
}

int gramian_kernel_id(const std::string& kernel) { return isa_id(kernel, "kernel"); }

int gramian_kernel_checked(const std::string& kernel) {
  const int resolved = wtc::gramian_kernel_resolve(gramian_kernel_id(kernel));
  if (resolved < 0) throw py::value_error("this CPU cannot run the '" + kernel + "' Gramian kernel");
  return resolved;
}

// Element strides of a (..., D) input; numpy strides are in bytes.
template <class T>
wtc::RowView<T> row_view(const py::array& a, const char* name) {
  wtc::RowView<T> v{static_cast<const T*>(a.data()), 0, 0, 1, 0, 0, 1};
  for (int ax = 0; ax < a.ndim(); ++ax)
    if (a.strides(ax) % static_cast<py::ssize_t>(sizeof(T)) != 0)
      throw py::value_error(std::string(name) + ": strides are not a multiple of the item size");
  if (a.ndim() == 2) {
    v.rows = a.shape(0); v.D = a.shape(1); v.K = 1;
    v.s0 = a.strides(0) / sizeof(T); v.cs = a.strides(1) / sizeof(T);
  } else {
    v.rows = a.shape(0) * a.shape(1); v.D = a.shape(2); v.K = std::max<int64_t>(a.shape(1), 1);
    v.s0 = a.strides(0) / sizeof(T); v.s1 = a.strides(1) / sizeof(T); v.cs = a.strides(2) / sizeof(T);
  }
  return v;
}

enum class Dt { f32, f64 };

Dt float_dtype(const py::array& a, const char* name) {
  if (a.dtype().is(py::dtype::of<float>())) return Dt::f32;
  if (a.dtype().is(py::dtype::of<double>())) return Dt::f64;
  throw py::value_error(std::string(name) + " must be float32 or float64, got dtype " +
                        std::string(py::str(a.dtype())));
}

double* state_buffer(py::array& a, int nd, int64_t D, const char* name) {
  if (!a.dtype().is(py::dtype::of<double>()))
    throw py::value_error(std::string(name) + " (accumulator state) must be float64, got dtype " +
                          std::string(py::str(a.dtype())));
  if (a.ndim() != nd || a.shape(0) != D || (nd == 2 && a.shape(1) != D)) {
    throw py::value_error(std::string(name) + " (accumulator state) must have shape " + (nd == 1 ? "(D,)" : "(D, D)") +
                          " with D = " + std::to_string(D));
  }
  if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string(name) + " (accumulator state) must be C-contiguous");
  if (!a.writeable()) throw py::value_error(std::string(name) + " (accumulator state) must be writeable");
  return static_cast<double*>(a.mutable_data());
}

template <class T>
[[noreturn]] void nonfinite_error(const wtc::RowView<T>& v, int64_t bad, const char* what, bool three_d) {
  const int64_t r = bad / v.D, d = bad % v.D;
  const std::string at = three_d ? "(sample " + std::to_string(r / v.K) + ", output " + std::to_string(r % v.K) +
                                       ", column " + std::to_string(d) + ")"
                                 : "(row " + std::to_string(r) + ", column " + std::to_string(d) + ")";
  throw py::value_error(std::string(what) + " hold NaN/inf at " + at);
}

template <class TH, class TJ>
void gramian_update_typed(const py::array& h, const py::array& J, int64_t n_prev, double* mean, double* m2,
                          double* jj, int kernel) {
  const auto hv = row_view<TH>(h, "h");
  const auto jv = row_view<TJ>(J, "J");
  // both checked before anything is written: a bad chunk leaves the accumulator as it was
  wtc::GramianStatus st;
  {
    py::gil_scoped_release nogil;
    st = wtc::gramian_update_cpu(hv, jv, n_prev, mean, m2, jj, kernel);
  }
  if (st.bad_h >= 0) nonfinite_error(hv, st.bad_h, "activations h", false);
  if (st.overflow) throw py::value_error("activations h: their float64 sum overflows (values too large)");
  if (st.bad_j >= 0) nonfinite_error(jv, st.bad_j, "Jacobians J", true);
}

int64_t gramian_update(py::array h, py::array J, py::array mean, py::array m2, py::array jj, int64_t n_prev,
                       const std::string& kernel) {
  expect_dims(h, 2, "h", "(n, D)");
  expect_dims(J, 3, "J", "(n, K, D)");
  const int64_t n = h.shape(0), D = h.shape(1);
  if (D < 1) throw py::value_error("h: D (axis 1) must be at least 1");
  expect_dim(J.shape(0), n, "J", 0);
  expect_dim(J.shape(2), D, "J", 2);
  if (J.shape(1) < 1) throw py::value_error("J: K (axis 1) must be at least 1");
  if (n_prev < 0) throw py::value_error("n_prev must be >= 0");
  const Dt th = float_dtype(h, "h"), tj = float_dtype(J, "J");
  double* mu = state_buffer(mean, 1, D, "mean");
  double* s = state_buffer(m2, 2, D, "m2");
  double* g = state_buffer(jj, 2, D, "jj");
  if (mu == s || mu == g || s == g) throw py::value_error("mean, m2 and jj must be distinct buffers");
  const int k = gramian_kernel_checked(kernel);
  if (th == Dt::f32 && tj == Dt::f32) gramian_update_typed<float, float>(h, J, n_prev, mu, s, g, k);
  else if (th == Dt::f32) gramian_update_typed<float, double>(h, J, n_prev, mu, s, g, k);
  else if (tj == Dt::f32) gramian_update_typed<double, float>(h, J, n_prev, mu, s, g, k);
  else gramian_update_typed<double, double>(h, J, n_prev, mu, s, g, k);
  return n_prev + n;
}


// ---- which instruction set the DT kernels run (dt_isa.h)
// WTC_NATIVE_ISA is read once, when the module loads. A value that is not an ISA name, or names one
// this CPU cannot run, is kept as an error that every DT op (and dt_isa()) raises: the kernels never
// run another ISA than the one asked for. set_dt_isa() replaces the choice (and clears the error).
std::string& dt_isa_error() {
  static std::string error;
  return error;
}

// The ISAs this CPU runs the DT kernels in, widest first.
std::vector<std::string> dt_isas() {
  std::vector<std::string> out;
  for (int k : {wtc::kDtIsaAvx512, wtc::kDtIsaAvx2, wtc::kDtIsaPortable})
    if (wtc::dt_isa_resolve(k) == k) out.emplace_back(wtc::gramian_kernel_name(k));
  return out;
}

std::string dt_isas_text() {
  std::string out;
  for (const auto& name : dt_isas()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// The resolved ISA for `name`, or a ValueError naming `what` asked for it.
int dt_isa_choose(const std::string& name, const std::string& what) {
  const int resolved = wtc::dt_isa_set(isa_id(name, what));
  if (resolved < 0)
    throw py::value_error(what + " asks for '" + name + "', which this CPU cannot run (it runs: " + dt_isas_text() + ")");
  return resolved;
}

void dt_isa_from_env() {
  const char* env = std::getenv("WTC_NATIVE_ISA");
  std::string name = env == nullptr ? "" : env;
  name.erase(0, name.find_first_not_of(" \t"));
  name.erase(name.find_last_not_of(" \t") + 1);
  for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (name.empty()) name = "auto";
  try {
    dt_isa_choose(name, "WTC_NATIVE_ISA");
  } catch (const py::value_error& e) {
    dt_isa_error() = e.what();
  }
}

// The ISA the DT kernels run; raises the WTC_NATIVE_ISA error when there is one.
int dt_isa_checked() {
  if (!dt_isa_error().empty()) throw py::value_error(dt_isa_error());
  return wtc::dt_isa();
}

// ---- fused DT routing (dt_route.cpp): shapes checked here, names in the errors as in Python
struct DtRouteArgs {
  farr zq, zk, val, W, u, rel, abs_, scale, content;
  wtc::DtRouteShapes s;
  wtc::DtRouteInputs in;
};

DtRouteArgs dt_route_args(farr zq, farr zk, farr val, farr W, farr u, farr rel, farr abs_, farr scale,
                          farr content, int pad, double tau, bool hard, int64_t seed) {
  expect_dims(zq, 4, "zq", "(R, B, H, T)");
  expect_dims(zk, 4, "zk", "(R, B, H, L)");
  expect_dims(val, 4, "val", "(R, B, H, L)");
  expect_dims(W, 4, "W", "(R, H, N, N)");
  expect_dims(u, 3, "u", "(R, H, N)");
  expect_dims(rel, 3, "rel", "(R, H, L)");
  expect_dims(abs_, 3, "abs", "(R, H, L)");
  expect_dims(scale, 2, "scale", "(R, H)");
  expect_dims(content, 1, "content", "(R,)");
  const int64_t R = zq.shape(0), B = zq.shape(1), H = zq.shape(2), T = zq.shape(3), L = zk.shape(3);
  const int64_t N = W.shape(2);
  if (pad < 0 || L != T + pad) throw py::value_error("route: keys L must equal T + pad (pad >= 0)");
  if (T < 1 || N < 1) throw py::value_error("route: T and the PLE bins N must be >= 1");
  if (!(tau > 0)) throw py::value_error("route: tau must be > 0");
  if (seed < -1 || seed > 0xFFFFFFFFLL) throw py::value_error("route: seed must be -1 (no noise) or in [0, 2^32)");
  if (R * B * H > 0xFFFFFFFFLL || T * L > 0xFFFFFFFFLL)
    throw py::value_error("route: R * B * H and T * L must each fit in 32 bits (the noise counters)");
  for (int ax = 0; ax < 3; ++ax) {
    expect_dim(zk.shape(ax), zq.shape(ax), "zk", ax);
    expect_dim(val.shape(ax), zq.shape(ax), "val", ax);
  }
  expect_dim(val.shape(3), L, "val", 3);
  const py::array* per_head[] = {&W, &u, &rel, &abs_, &scale};
  const char* names[] = {"W", "u", "rel", "abs", "scale"};
  for (int k = 0; k < 5; ++k) {
    expect_dim(per_head[k]->shape(0), R, names[k], 0);
    expect_dim(per_head[k]->shape(1), H, names[k], 1);
  }
  expect_dim(W.shape(3), N, "W", 3);
  expect_dim(u.shape(2), N, "u", 2);
  expect_dim(rel.shape(2), L, "rel", 2);
  expect_dim(abs_.shape(2), L, "abs", 2);
  expect_dim(content.shape(0), R, "content", 0);
  DtRouteArgs a{zq, zk, val, W, u, rel, abs_, scale, content, {R, B, H, T, L, N, pad}, {}};
  a.in = {a.zq.data(), a.zk.data(), a.val.data(), a.W.data(), a.u.data(), a.rel.data(), a.abs_.data(),
          a.scale.data(), a.content.data(), static_cast<float>(1.0 / tau), hard, seed >= 0,
          static_cast<uint32_t>(seed < 0 ? 0 : seed)};
  return a;
}

py::tuple dt_route_forward(farr zq, farr zk, farr val, farr W, farr u, farr rel, farr abs_, farr scale,
                           farr content, int pad, double tau, bool hard, int64_t seed, bool overlap,
                           bool entropy, int threads, int64_t keep_bytes) {
  dt_isa_checked();
  DtRouteArgs a = dt_route_args(zq, zk, val, W, u, rel, abs_, scale, content, pad, tau, hard, seed);
  if (overlap && hard) throw py::value_error("route: overlaps are defined for soft routing only (hard=False)");
  const auto& s = a.s;
  py::array_t<float> out({s.R, s.B, s.H, s.T});
  py::array_t<float> o_rows(overlap ? std::vector<int64_t>{s.R, s.B, s.H, s.H, s.T} : std::vector<int64_t>{0});
  py::array_t<float> ent(entropy ? std::vector<int64_t>{s.R, s.B, s.H, s.T} : std::vector<int64_t>{0});
  // what the backward needs, kept where its layout (dt_route_saved_floats) fits keep_bytes; else empty
  const int64_t floats = wtc::dt_route_saved_floats(s, a.in.content);
  const bool save = keep_bytes > 0 && floats * static_cast<int64_t>(sizeof(float)) <= keep_bytes;
  py::array_t<float> saved(save ? floats : 0);
  {
    py::gil_scoped_release nogil;
    wtc::dt_route_forward(s, a.in, out.mutable_data(), overlap ? o_rows.mutable_data() : nullptr,
                          entropy ? ent.mutable_data() : nullptr, save ? saved.mutable_data() : nullptr, threads);
  }
  return py::make_tuple(out, o_rows, ent, saved);
}

py::tuple dt_route_backward(farr zq, farr zk, farr val, farr W, farr u, farr rel, farr abs_, farr scale,
                            farr content, int pad, double tau, bool hard, int64_t seed, farr dout,
                            py::object c, bool score_grads, int threads, py::object saved) {
  dt_isa_checked();
  DtRouteArgs a = dt_route_args(zq, zk, val, W, u, rel, abs_, scale, content, pad, tau, hard, seed);
  const auto& s = a.s;
  expect_dims(dout, 4, "dout", "(R, B, H, T)");
  for (int ax = 0; ax < 4; ++ax) expect_dim(dout.shape(ax), zq.shape(ax), "dout", ax);
  farr cg;
  const bool has_c = !c.is_none();
  if (has_c) {
    if (hard) throw py::value_error("route: overlaps are defined for soft routing only (hard=False)");
    cg = farr::ensure(c);
    if (!cg) throw py::value_error("c must be a float32 array (R, B, H, H, T)");
    expect_dims(cg, 5, "c", "(R, B, H, H, T)");
    const int64_t want[] = {s.R, s.B, s.H, s.H, s.T};
    for (int ax = 0; ax < 5; ++ax) expect_dim(cg.shape(ax), want[ax], "c", ax);
  }
  farr kept;
  const bool has_kept = !saved.is_none();
  if (has_kept) {   // what the forward kept for these inputs: its size is the layout's, or it is not theirs
    kept = farr::ensure(saved);
    if (!kept || kept.ndim() != 1 || kept.shape(0) != wtc::dt_route_saved_floats(s, a.in.content))
      throw py::value_error("route: saved must be the float32 array dt_route_forward kept for these inputs");
  }
  py::array_t<float> dzq({s.R, s.B, s.H, s.T}), dzk({s.R, s.B, s.H, s.L}), dval({s.R, s.B, s.H, s.L});
  py::array_t<float> dW({s.R, s.H, s.N, s.N}), du({s.R, s.H, s.N}), drel({s.R, s.H, s.L});
  py::array_t<float> dabs({s.R, s.H, s.L}), dscale({s.R, s.H});
  wtc::DtRouteGrads g{dzq.mutable_data(), dzk.mutable_data(), dval.mutable_data(), dW.mutable_data(),
                      du.mutable_data(), drel.mutable_data(), dabs.mutable_data(), dscale.mutable_data()};
  {
    py::gil_scoped_release nogil;
    wtc::dt_route_backward(s, a.in, dout.data(), has_c ? cg.data() : nullptr, score_grads, g,
                           has_kept ? kept.data() : nullptr, threads);
  }
  if (!score_grads) return py::make_tuple(py::none(), py::none(), dval, py::none(), py::none(), py::none(),
                                          py::none(), py::none());
  return py::make_tuple(dzq, dzk, dval, dW, du, drel, dabs, dscale);
}

// ---- the DT's sub-MLP bank (dt_mlp.cpp)
// T = float (training) or double (the precision pass): arrays of one dtype, cast by pybind11
template <typename T>
using tarr = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
struct DtMlpArgs {
  tarr<T> x, W1, b1, W2, b2, skip, W_mid, b_mid;
  wtc::DtMlpShapes s;
  wtc::DtMlpParamsT<T> p;
};

template <typename T>
DtMlpArgs<T> dt_mlp_args(tarr<T> x, tarr<T> W1, tarr<T> b1, tarr<T> W2, tarr<T> b2, tarr<T> skip, int act,
                         py::object W_mid, py::object b_mid) {
  expect_dims(x, 4, "x", "(R, n, M, k)");
  expect_dims(W1, 4, "W1", "(R, M, hidden, k)");
  expect_dims(b1, 3, "b1", "(R, M, hidden)");
  expect_dims(W2, 3, "W2", "(R, M, hidden)");
  expect_dims(b2, 2, "b2", "(R, M)");
  expect_dims(skip, 3, "skip", "(R, M, k)");
  if (act < 0 || act > 4) throw py::value_error("mlp: act must be 0 relu, 1 silu, 2 gelu, 3 tanh or 4 relu+silu");
  const int64_t R = x.shape(0), n = x.shape(1), M = x.shape(2), k = x.shape(3), Hd = W1.shape(2);
  const int depth = W_mid.is_none() ? 1 : 2;
  if (W_mid.is_none() != b_mid.is_none()) throw py::value_error("mlp: W_mid and b_mid go together");
  expect_dim(W1.shape(0), R, "W1", 0);
  expect_dim(W1.shape(1), M, "W1", 1);
  expect_dim(W1.shape(3), k, "W1", 3);
  const py::array* rmh[] = {&b1, &W2};
  const char* names[] = {"b1", "W2"};
  for (int i = 0; i < 2; ++i) {
    expect_dim(rmh[i]->shape(0), R, names[i], 0);
    expect_dim(rmh[i]->shape(1), M, names[i], 1);
    expect_dim(rmh[i]->shape(2), Hd, names[i], 2);
  }
  expect_dim(b2.shape(0), R, "b2", 0);
  expect_dim(b2.shape(1), M, "b2", 1);
  expect_dim(skip.shape(0), R, "skip", 0);
  expect_dim(skip.shape(1), M, "skip", 1);
  expect_dim(skip.shape(2), k, "skip", 2);
  DtMlpArgs<T> a{x, W1, b1, W2, b2, skip, tarr<T>(), tarr<T>(), {R, n, M, k, Hd, depth, act}, {}};
  if (depth == 2) {
    a.W_mid = tarr<T>::ensure(W_mid);
    a.b_mid = tarr<T>::ensure(b_mid);
    if (!a.W_mid || !a.b_mid) throw py::value_error("mlp: W_mid and b_mid must be arrays");
    expect_dims(a.W_mid, 4, "W_mid", "(R, M, hidden, hidden)");
    expect_dims(a.b_mid, 3, "b_mid", "(R, M, hidden)");
    const int64_t wm[] = {R, M, Hd, Hd};
    for (int ax = 0; ax < 4; ++ax) expect_dim(a.W_mid.shape(ax), wm[ax], "W_mid", ax);
    for (int ax = 0; ax < 3; ++ax) expect_dim(a.b_mid.shape(ax), wm[ax], "b_mid", ax);
  }
  a.p = {a.W1.data(), a.b1.data(), a.W2.data(), a.b2.data(), a.skip.data(),
         depth == 2 ? a.W_mid.data() : nullptr, depth == 2 ? a.b_mid.data() : nullptr};
  return a;
}

template <typename T>
py::array_t<T> dt_mlp_forward(tarr<T> x, tarr<T> W1, tarr<T> b1, tarr<T> W2, tarr<T> b2, tarr<T> skip, int act,
                              py::object W_mid, py::object b_mid, int threads) {
  dt_isa_checked();
  DtMlpArgs<T> a = dt_mlp_args<T>(x, W1, b1, W2, b2, skip, act, W_mid, b_mid);
  py::array_t<T> y({a.s.R, a.s.n, a.s.M});
  {
    py::gil_scoped_release nogil;
    wtc::dt_mlp_forward(a.s, a.x.data(), a.p, y.mutable_data(), threads);
  }
  return y;
}

template <typename T>
py::tuple dt_mlp_backward(tarr<T> x, tarr<T> W1, tarr<T> b1, tarr<T> W2, tarr<T> b2, tarr<T> skip, int act,
                          py::object W_mid, py::object b_mid, tarr<T> dy, int threads) {
  dt_isa_checked();
  DtMlpArgs<T> a = dt_mlp_args<T>(x, W1, b1, W2, b2, skip, act, W_mid, b_mid);
  const auto& s = a.s;
  expect_dims(dy, 3, "dy", "(R, n, M)");
  expect_dim(dy.shape(0), s.R, "dy", 0);
  expect_dim(dy.shape(1), s.n, "dy", 1);
  expect_dim(dy.shape(2), s.M, "dy", 2);
  py::array_t<T> dx({s.R, s.n, s.M, s.k}), dW1({s.R, s.M, s.hidden, s.k}), db1({s.R, s.M, s.hidden});
  py::array_t<T> dW2({s.R, s.M, s.hidden}), db2({s.R, s.M}), dskip({s.R, s.M, s.k});
  const bool deep = s.depth == 2;
  py::array_t<T> dWm(deep ? std::vector<int64_t>{s.R, s.M, s.hidden, s.hidden} : std::vector<int64_t>{0});
  py::array_t<T> dbm(deep ? std::vector<int64_t>{s.R, s.M, s.hidden} : std::vector<int64_t>{0});
  wtc::DtMlpGradsT<T> g{dx.mutable_data(), dW1.mutable_data(), db1.mutable_data(), dW2.mutable_data(),
                    db2.mutable_data(), dskip.mutable_data(), deep ? dWm.mutable_data() : nullptr,
                    deep ? dbm.mutable_data() : nullptr};
  {
    py::gil_scoped_release nogil;
    wtc::dt_mlp_backward(s, a.x.data(), a.p, dy.data(), g, threads);
  }
  if (!deep) return py::make_tuple(dx, dW1, db1, dW2, db2, dskip, py::none(), py::none());
  return py::make_tuple(dx, dW1, db1, dW2, db2, dskip, dWm, dbm);
}

// ---- the linear screen (wtc.sr.screen): numba_eval's signatures; buffers are written in place, so
// each must already have its dtype, shape and C order (no converting copy), and every index it
// holds is checked before a loop reads through it.
template <class T>
T* screen_buf(py::array& a, const char* name, std::initializer_list<int64_t> shape) {
  if (!a.dtype().is(py::dtype::of<T>()))
    throw py::value_error(std::string(name) + " must have dtype " + std::string(py::str(py::dtype::of<T>())) +
                          ", got " + std::string(py::str(a.dtype())));
  if (a.ndim() != static_cast<py::ssize_t>(shape.size()))
    throw py::value_error(std::string(name) + " must have " + std::to_string(shape.size()) + " dimensions, got " +
                          std::to_string(a.ndim()));
  int axis = 0;
  for (int64_t want : shape) {
    if (want >= 0) expect_dim(a.shape(axis), want, name, axis);
    ++axis;
  }
  if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string(name) + " must be C-contiguous");
  if (!a.writeable()) throw py::value_error(std::string(name) + " must be writeable");
  return static_cast<T*>(a.mutable_data());
}

void screen_indices(const int64_t* v, int64_t n, int64_t lo, int64_t N, const char* name) {
  for (int64_t k = 0; k < n; ++k)
    if (v[k] < lo || v[k] >= N)
      throw py::value_error(std::string(name) + " holds " + std::to_string(v[k]) + ", outside [" + std::to_string(lo) +
                            ", " + std::to_string(N) + ")");
}

struct ScreenArgs {
  const double* G;
  const double* b;
  const int64_t* sizes;
  const bool* pass1;
  int64_t N;
  wtc::ScreenBest best;
  wtc::ScreenOut out;
};

ScreenArgs screen_args(py::array& G, py::array& b, py::array& sizes, py::array& pass1, int64_t max_lb,
                       py::array& best_sse, py::array& best_idx, py::array& out_idx, py::array& out_sse, int64_t cap,
                       int64_t width) {
  const int64_t N = b.ndim() == 1 ? b.shape(0) : -1;
  ScreenArgs a{};
  a.N = N;
  a.b = screen_buf<double>(b, "b", {-1});
  a.G = screen_buf<double>(G, "G", {N, N});
  a.sizes = screen_buf<int64_t>(sizes, "sizes", {N});
  a.pass1 = screen_buf<bool>(pass1, "pass1", {N});
  screen_indices(a.sizes, N, 0, std::numeric_limits<int64_t>::max() / 4, "sizes");
  const int64_t L = best_sse.ndim() == 2 ? best_sse.shape(0) : -1, nb = best_sse.ndim() == 2 ? best_sse.shape(1) : -1;
  if (max_lb < 0 || max_lb >= L || nb < 1)
    throw py::value_error("best_sse must have shape (L, n_best) with n_best >= 1 and L > max_lb = " + std::to_string(max_lb));
  a.best = {screen_buf<double>(best_sse, "best_sse", {L, nb}), screen_buf<int64_t>(best_idx, "best_idx", {L, nb, 3}), nb};
  if (cap < 0 || out_idx.ndim() != 2 || cap > out_idx.shape(0))
    throw py::value_error("cap must be in [0, len(out_idx)], got " + std::to_string(cap));
  a.out = {screen_buf<int64_t>(out_idx, "out_idx", {-1, width}), screen_buf<double>(out_sse, "out_sse", {out_idx.shape(0)}), cap};
  return a;
}

void screen_count(int64_t n_out, int64_t cap) {
  if (n_out < 0 || n_out > cap) throw py::value_error("n_out must be in [0, cap], got " + std::to_string(n_out));
}

void screen_offer(py::array best_sse, py::array best_idx, int64_t lb, double sse, int64_t i, int64_t j, int64_t q) {
  const int64_t L = best_sse.ndim() == 2 ? best_sse.shape(0) : -1, nb = best_sse.ndim() == 2 ? best_sse.shape(1) : -1;
  if (lb < 0 || lb >= L || nb < 1) throw py::value_error("lb must index a row of best_sse (L, n_best), got " + std::to_string(lb));
  wtc::screen_offer({screen_buf<double>(best_sse, "best_sse", {L, nb}), screen_buf<int64_t>(best_idx, "best_idx", {L, nb, 3}), nb},
                    lb, sse, i, j, q);
}

int64_t screen_pairs(py::array G, py::array b, double yy, py::array sizes, double sse_pass, int64_t max_lb,
                     py::array pass1, py::array best_sse, py::array best_idx, py::array out_idx, py::array out_sse,
                     int64_t cap, py::array PP, py::array top_sse, py::array top_idx) {
  ScreenArgs a = screen_args(G, b, sizes, pass1, max_lb, best_sse, best_idx, out_idx, out_sse, cap, 2);
  const int64_t n_top = top_sse.ndim() == 1 ? top_sse.shape(0) : -1;
  if (n_top < 1) throw py::value_error("top_sse must have shape (n_top,) with n_top >= 1");
  bool* pp = screen_buf<bool>(PP, "PP", {a.N, a.N});
  double* ts = screen_buf<double>(top_sse, "top_sse", {n_top});
  int64_t* ti = screen_buf<int64_t>(top_idx, "top_idx", {n_top, 2});
  return wtc::screen_pairs(a.G, a.b, yy, a.sizes, a.N, sse_pass, max_lb, a.pass1, a.best, a.out, pp, ts, ti, n_top);
}

int64_t screen_triples(py::array G, py::array b, double yy, py::array T, py::array sizes, double sse_pass,
                       int64_t max_lb, py::array pass1, py::array PP, py::array best_sse, py::array best_idx,
                       py::array out_idx, py::array out_sse, int64_t n_out, int64_t cap) {
  ScreenArgs a = screen_args(G, b, sizes, pass1, max_lb, best_sse, best_idx, out_idx, out_sse, cap, 3);
  screen_count(n_out, cap);
  const int64_t* t = screen_buf<int64_t>(T, "T", {-1});
  screen_indices(t, T.shape(0), 0, a.N, "T");
  const bool* pp = screen_buf<bool>(PP, "PP", {a.N, a.N});
  return wtc::screen_triples(a.G, a.b, yy, a.N, t, T.shape(0), a.sizes, sse_pass, max_lb, a.pass1, pp, a.best, a.out,
                             n_out);
}

int64_t screen_extend(py::array G, py::array b, double yy, py::array top_idx, int64_t n_top, py::array inT,
                      py::array sizes, double sse_pass, int64_t max_lb, py::array pass1, py::array PP,
                      py::array best_sse, py::array best_idx, py::array out_idx, py::array out_sse, int64_t n_out,
                      int64_t cap) {
  ScreenArgs a = screen_args(G, b, sizes, pass1, max_lb, best_sse, best_idx, out_idx, out_sse, cap, 3);
  screen_count(n_out, cap);
  const int64_t rows = top_idx.ndim() == 2 ? top_idx.shape(0) : -1;
  const int64_t* ti = screen_buf<int64_t>(top_idx, "top_idx", {rows, 2});
  if (n_top < 0 || n_top > rows) throw py::value_error("n_top must be in [0, len(top_idx)], got " + std::to_string(n_top));
  screen_indices(ti, 2 * n_top, -1, a.N, "top_idx");
  const bool* in_t = screen_buf<bool>(inT, "inT", {a.N});
  const bool* pp = screen_buf<bool>(PP, "PP", {a.N, a.N});
  return wtc::screen_extend(a.G, a.b, yy, a.N, ti, n_top, in_t, a.sizes, sse_pass, max_lb, a.pass1, pp, a.best, a.out,
                            n_out);
}
}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "wtc CPU kernels (C++17, OpenMP)";
  m.def("route_hard", &route_hard, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("q_bins"),
        py::arg("k_bins"), py::arg("W"), py::arg("u"), py::arg("rel"), py::arg("abs"),
        py::arg("q_offset"),
        "Argmax routing of G heads over N sequences -> (index int64, value, margin), each (G, N, Lq).");
  m.def("gumbel_hash", &gumbel_hash, py::arg("seed"), py::arg("streams"), py::arg("T"), py::arg("L"),
        "Counter-based Gumbel noise (streams, T, L), float32: the bits of wtc.dt.noise.gumbel_hash");
  m.def("dt_route_forward", &dt_route_forward, py::arg("zq"), py::arg("zk"), py::arg("val"), py::arg("W"),
        py::arg("u"), py::arg("rel"), py::arg("abs"), py::arg("scale"), py::arg("content"), py::arg("pad"),
        py::arg("tau"), py::arg("hard"), py::arg("seed"), py::arg("overlap"), py::arg("entropy"), py::arg("threads"),
        py::arg("keep_bytes") = 0,
        "Fused DT pointer-head routing (seed -1: no noise) -> (out (R, B, H, T), overlaps (R, B, H, H, T) "
        "or empty, entropies of the noise-free softmax (R, B, H, T) or empty, what the backward needs "
        "(1-D) where it fits keep_bytes, else empty); see csrc/dt_route.h.");
  m.def("dt_route_backward", &dt_route_backward, py::arg("zq"), py::arg("zk"), py::arg("val"), py::arg("W"),
        py::arg("u"), py::arg("rel"), py::arg("abs"), py::arg("scale"), py::arg("content"), py::arg("pad"),
        py::arg("tau"), py::arg("hard"), py::arg("seed"), py::arg("dout"), py::arg("c"), py::arg("score_grads"),
        py::arg("threads"), py::arg("saved") = py::none(),
        "Gradients of dt_route_forward -> (dzq, dzk, dval, dW, du, drel, dabs, dscale); all but dval None "
        "without score_grads. c: symmetrised overlap gradients or None. saved: what the forward kept for "
        "these inputs (save=True), or None: recomputed.");
  m.def("dt_mlp_forward", &dt_mlp_forward<float>, py::arg("x"), py::arg("W1"), py::arg("b1"), py::arg("W2"),
        py::arg("b2"), py::arg("skip"), py::arg("act"), py::arg("W_mid"), py::arg("b_mid"), py::arg("threads"),
        "The DT's sub-MLP bank on inputs x (R, n, M, k) -> y (R, n, M), float32; act 0 relu, 1 silu, 2 gelu, "
        "3 tanh, 4 relu+silu; W_mid, b_mid None for one hidden layer. See csrc/dt_mlp.h.");
  m.def("dt_mlp_backward", &dt_mlp_backward<float>, py::arg("x"), py::arg("W1"), py::arg("b1"), py::arg("W2"),
        py::arg("b2"), py::arg("skip"), py::arg("act"), py::arg("W_mid"), py::arg("b_mid"), py::arg("dy"),
        py::arg("threads"),
        "Gradients of dt_mlp_forward by recomputation -> (dx, dW1, db1, dW2, db2, dskip, dW_mid, db_mid).");
  m.def("dt_mlp_forward_f64", &dt_mlp_forward<double>, py::arg("x"), py::arg("W1"), py::arg("b1"), py::arg("W2"),
        py::arg("b2"), py::arg("skip"), py::arg("act"), py::arg("W_mid"), py::arg("b_mid"), py::arg("threads"),
        "dt_mlp_forward in float64 (the precision pass).");
  m.def("dt_mlp_backward_f64", &dt_mlp_backward<double>, py::arg("x"), py::arg("W1"), py::arg("b1"), py::arg("W2"),
        py::arg("b2"), py::arg("skip"), py::arg("act"), py::arg("W_mid"), py::arg("b_mid"), py::arg("dy"),
        py::arg("threads"), "dt_mlp_backward in float64.");
  m.def("kl_rows", &kl_rows, py::arg("logp"), py::arg("logits"),
        "Per-position KL(p || softmax(logits)): logp (N, V) float64, logits (A, N, V) -> (A, N) float64.");
  m.def("kl_rank1", &kl_rank1, py::arg("logp"), py::arg("logits"), py::arg("delta"), py::arg("direction"),
        "KL(p || softmax(logits + delta[a, n] * direction[a])) -> (A, N) float64, nothing materialised.");
  m.def("kl_unembed", &kl_unembed, py::arg("logp"), py::arg("h"), py::arg("W"), py::arg("v"),
        py::arg("j"), py::arg("per_position") = false,
        "Closed-form KL of zeroing W[v[m], j[m]] for M pairs: (total (M,) float64, "
        "per-position (M, N) float32 or empty).");
  m.def("importance_positions", &importance_positions, py::arg("kl"), py::arg("mass") = 0.9,
        "Smallest position sets holding `mass` of each row's KL: (offsets (M + 1), positions) CSR.");
  m.def("gramian_update", &gramian_update, py::arg("h"), py::arg("J"), py::arg("mean"), py::arg("m2"),
        py::arg("jj"), py::arg("n_prev"), py::arg("kernel") = "auto",
        "Fold a chunk h (n, D), J (n, K, D) (float32/float64) into float64 state in place: mean (D,), "
        "m2 = centred scatter (D, D) by Chan's merge, jj += J^T J (D, D); upper triangles only. "
        "Returns n_prev + n. Inputs are checked finite before anything is written.");
  m.def("gramian_kernel", [](const std::string& kernel) {
          return std::string(wtc::gramian_kernel_name(gramian_kernel_checked(kernel)));
        }, py::arg("kernel") = "auto", "The Gramian micro-kernel `kernel` resolves to on this CPU.");
  dt_isa_from_env();
  m.def("dt_isa", []() { return std::string(wtc::gramian_kernel_name(dt_isa_checked())); },
        "The instruction set the DT kernels (dt_route_*, dt_mlp_*) run: avx512, avx2 or portable; chosen when the "
        "module loads from the CPU and WTC_NATIVE_ISA (auto|avx512|avx2|portable). Raises ValueError when "
        "WTC_NATIVE_ISA is not a name or asks for an ISA this CPU cannot run (every DT op raises it too).");
  m.def("set_dt_isa", [](const std::string& isa) {
          const int resolved = dt_isa_choose(isa, "isa");
          dt_isa_error().clear();
          return std::string(wtc::gramian_kernel_name(resolved));
        }, py::arg("isa"),
        "Make the DT kernels run `isa` (auto|avx512|avx2|portable) from now on, replacing WTC_NATIVE_ISA's "
        "choice; returns the ISA it resolved to. ValueError when this CPU cannot run it.");
  m.def("dt_isas", []() {
          py::list out;
          for (const auto& name : dt_isas()) out.append(name);
          return out;
        }, "The instruction sets this CPU runs the DT kernels in, widest first.");
  m.def("num_threads", []() { return omp_get_max_threads(); },
        "OpenMP threads the kernels may use.");
  m.def("set_num_threads", [](int n) { omp_set_num_threads(n); }, py::arg("n"));

  py::module_ sc = m.def_submodule("screen", "The linear screen's loops (wtc.sr.screen), numba_eval's signatures.");
  sc.def("_offer", &screen_offer, py::arg("best_sse"), py::arg("best_idx"), py::arg("lb"), py::arg("sse"),
         py::arg("i"), py::arg("j"), py::arg("q"), "Insert (sse, i, j, q) into row lb of the best lists.");
  sc.def("pairs", &screen_pairs, py::arg("G"), py::arg("b"), py::arg("yy"), py::arg("sizes"), py::arg("sse_pass"),
         py::arg("max_lb"), py::arg("pass1"), py::arg("best_sse"), py::arg("best_idx"), py::arg("out_idx"),
         py::arg("out_sse"), py::arg("cap"), py::arg("PP"), py::arg("top_sse"), py::arg("top_idx"),
         "All pairs; see csrc/sr_screen.h. Returns the count of passing pairs written.");
  sc.def("triples", &screen_triples, py::arg("G"), py::arg("b"), py::arg("yy"), py::arg("T"), py::arg("sizes"),
         py::arg("sse_pass"), py::arg("max_lb"), py::arg("pass1"), py::arg("PP"), py::arg("best_sse"),
         py::arg("best_idx"), py::arg("out_idx"), py::arg("out_sse"), py::arg("n_out"), py::arg("cap"),
         "All triples of T; returns the new count of passing subsets.");
  sc.def("extend", &screen_extend, py::arg("G"), py::arg("b"), py::arg("yy"), py::arg("top_idx"), py::arg("n_top"),
         py::arg("inT"), py::arg("sizes"), py::arg("sse_pass"), py::arg("max_lb"), py::arg("pass1"), py::arg("PP"),
         py::arg("best_sse"), py::arg("best_idx"), py::arg("out_idx"), py::arg("out_sse"), py::arg("n_out"),
         py::arg("cap"), "A third term on the top pairs; returns the new count of passing subsets.");
}
