#pragma once
// The pickle that torch.save writes for a state dict (the `data.pkl` of a .pth zip), read by a
// small interpreter of the pickle opcodes that never executes anything: it knows protocol 2's
// opcodes for ints, strings, tuples, dicts and memo references, and exactly these globals,
// each replaced by what it would build:
//
//   collections.OrderedDict          called with () -> an empty dict
//   torch._utils._rebuild_tensor_v2  called with (storage, offset, size, stride, requires_grad,
//                                    backward_hooks[, metadata]) -> a tensor record
//   torch.{Float,Half,BFloat16,Long,Int,Byte}Storage
//                                    only inside a persistent id ('storage', class, key,
//                                    location, numel) -> a storage record
//
// BUILD on a dict (the state dict's `_metadata` attribute) is accepted and its state dropped.
// Any other opcode or global is refused with an error naming the file, the opcode (or global)
// and its offset. Every count and size is bounded: the stack, the memo, the number of values
// made, the string lengths (by the pickle's own size).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace klein {

// One tensor of the state dict: a row-major view `shape` of `storage` (the zip entry
// data/<storage>) starting `offset` elements in. Strides other than row-major are refused.
struct TorchTensorRecord {
  std::string name;
  DType dtype = DType::F32;
  std::string storage;         // the storage's key
  uint64_t storage_numel = 0;  // elements the storage holds, as the pickle says
  uint64_t offset = 0;         // in elements
  Shape shape;
};

// The state dict in `pickle` (a dict or OrderedDict of string -> tensor), in its order.
// `where` names the file in errors.
std::vector<TorchTensorRecord> read_torch_state_dict_pickle(std::span<const std::byte> pickle,
                                                            const std::string& where);

}  // namespace klein
