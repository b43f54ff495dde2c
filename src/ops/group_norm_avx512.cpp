// The AVX-512 copy of group_norm_kernels.h's row transform (built with -ffp-contract=off).
#include "ops/group_norm_kernels.h"

namespace klein::ops::detail {

AffineKernel affine_kernel_avx512() { return &affine_rows; }

}  // namespace klein::ops::detail
