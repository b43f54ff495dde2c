#include "ops/blas.h"

#include <cblas.h>

namespace klein::ops {

void ensure_blas_single_threaded() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

}  // namespace klein::ops
