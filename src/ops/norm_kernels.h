#pragma once
// Internal to ops/norm.cpp: the vector forms of its activations, one file per instruction set.
#include <cstdint>

namespace klein::ops::detail {

#if defined(KLEIN_X86)
// out[i] = silu(gate[i]) · up[i]; out may be gate or up.
void swiglu_avx2(const float* gate, const float* up, float* out, int64_t n);
#endif

}  // namespace klein::ops::detail
