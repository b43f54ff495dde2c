#pragma once
// The arithmetic of one network pass, counted as multiply-adds, for measuring how close a
// run comes to the machine's peak (klein bench step). Each model states its own from its
// shapes (flux2::forward_work, zimage::forward_work).

namespace klein::ops {

struct ForwardWork {
  double linear_macs = 0;     // every weight matrix times the rows it sees (the quantized
                              // weights: what the integer kernels run)
  double attention_macs = 0;  // Q·Kᵀ and P·V of every block (float32 or bf16)
  double total() const { return linear_macs + attention_macs; }
};

}  // namespace klein::ops
