// The instruction set the DT's native kernels (dt_route.cpp, dt_mlp.cpp) run. Each file compiles
// its hot entry points three times, explicitly: for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA)
// and the build's baseline ("portable"), and calls them through a table of function pointers
// picked by dt_isa() once per op call (the kernels' loops run inside the chosen copy).
//
// Why explicit copies instead of GCC's target_clones: target_clones picks by CPU alone, once, in an
// ifunc resolver nobody can query or override; here the choice can be read (wtc._C.dt_isa, `wtc
// backends`) and forced (WTC_NATIVE_ISA, read when wtc._C loads), so an AVX-512 machine can run
// what an AVX2-only or older CPU runs (bench/cpu_isa.py) and tests can compare every copy.
//
// Asking for an ISA the CPU lacks is an error, not a silent fallback (see bindings.cpp): a timing or
// a test that believes it measured the AVX2 path must not have measured another one.
// Whether the CPU runs an ISA is the Gramian kernels' check (gramian_kernel_resolve): one
// implementation of that test, the same numbering (dt_isa_resolve adds what this build compiled).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "gramian.h"

namespace wtc {

enum DtIsa : int {
  kDtIsaAuto = kGramianAuto,
  kDtIsaPortable = kGramianPortable,
  kDtIsaAvx2 = kGramianAvx2,
  kDtIsaAvx512 = kGramianAvx512,
};

// The x86-64-v3 / v4 copies exist only where GCC knows those target names (x86-64 GCC 11 and later;
// gramian.cpp also needs them); elsewhere every ISA but portable is reported as not run here.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define WTC_DT_DISPATCH 1
#define WTC_DT_TARGET(arch) __attribute__((target(arch)))
#else
#define WTC_DT_TARGET(arch)
#endif

// |x| clamped to lim (> 0) with integer operations on the bits; NaN stays NaN (its magnitude bits
// lie above infinity's). Why not std::min / std::max or `x < lo ? lo : x`: under GCC's default
// -ftrapping-math a float comparison blocks if-conversion of a loop on targets without mask
// registers, so the exps of the softmax and of SiLU vectorised in the AVX-512 copy only and ran one
// lane at a time in the AVX2 and portable copies (the sub-MLP forward 4.6x slower on AVX2 than on
// AVX-512 in a real step, bench/cpu_isa.py). Integer compares cannot trap.
inline __attribute__((always_inline)) float clamp_abs(float x, float lim) {
  const uint32_t b = __builtin_bit_cast(uint32_t, x), mag = b & 0x7fffffffu;
  const uint32_t capped = std::min(mag, __builtin_bit_cast(uint32_t, lim));
  return __builtin_bit_cast(float, (b & 0x80000000u) | (mag > 0x7f800000u ? mag : capped));
}

// The same for double, the magnitude compared as a signed 64-bit integer (AVX2 has no unsigned one).
inline __attribute__((always_inline)) double clamp_abs(double x, double lim) {
  const uint64_t b = __builtin_bit_cast(uint64_t, x);
  const int64_t mag = static_cast<int64_t>(b & 0x7fffffffffffffffull);
  const int64_t capped = std::min(mag, __builtin_bit_cast(int64_t, lim));
  return __builtin_bit_cast(double, (b & 0x8000000000000000ull) |
                                        static_cast<uint64_t>(mag > 0x7ff0000000000000ll ? mag : capped));
}

// The resolved ISA (never kDtIsaAuto once read); 0 = not chosen yet.
inline std::atomic<int>& dt_isa_slot() {
  static std::atomic<int> slot{kDtIsaAuto};
  return slot;
}

// The ISA `want` resolves to (kDtIsaAuto: the widest this CPU runs), or -1 when the CPU, or this
// build, cannot run it.
inline int dt_isa_resolve(int want) {
#ifdef WTC_DT_DISPATCH
  return gramian_kernel_resolve(want);
#else
  return want == kDtIsaAuto || want == kDtIsaPortable ? static_cast<int>(kDtIsaPortable) : -1;
#endif
}

// Choose the ISA `want`. Returns the resolved ISA, or -1 (nothing changed) when it cannot run.
inline int dt_isa_set(int want) {
  const int resolved = dt_isa_resolve(want);
  if (resolved >= 0) dt_isa_slot().store(resolved);
  return resolved;
}

// The ISA the DT kernels run now: the one chosen, else the widest the CPU runs.
inline int dt_isa() {
  const int now = dt_isa_slot().load();
  return now != kDtIsaAuto ? now : dt_isa_set(kDtIsaAuto);
}

}  // namespace wtc
