#pragma once
// OpenBLAS is called from inside our own thread pool's tasks, one call per tile, so it must
// never start threads of its own. Call this before the first BLAS call (cheap after that).
namespace klein::ops {
void ensure_blas_single_threaded();
}
